//! Dashboard sessions and CSRF tokens, derived from the API token: a
//! session cookie is `v1.EXPIRES.NONCE.MAC`, where MAC is an HMAC-SHA256 of
//! the rest keyed with the API token, and a page's CSRF token is an HMAC of
//! the session cookie. So a cookie is good on every server with the token
//! (all servers of one PostgreSQL store, and a server after its restart),
//! and changing the API token ends every session. A logout ends one
//! session before it expires: its NONCE, the session's [`Session::id`], is
//! kept in the store until then (see `Queue::end_session`), where every
//! server looks for it. All comparisons are in constant time.

use axum::http::{HeaderMap, header};
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::auth::{ApiToken, constant_time_eq};

/// The session cookie's name.
pub const COOKIE: &str = "jobmgr_ui";

/// How long a session lasts after logging in, in seconds.
pub const LIFETIME_SECS: i64 = 12 * 3600;

/// A valid session: the cookie's value, its nonce and its expiry.
#[derive(Clone)]
pub struct Session {
    value: String,
    id: String,
    expires: i64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Session(<hidden>)")
    }
}

impl Session {
    /// A new session for someone who showed the API token, lasting
    /// [`LIFETIME_SECS`] from `now_secs`.
    pub fn mint(token: &ApiToken, now_secs: i64) -> Session {
        let mut nonce = [0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        let id = hex(&nonce);
        let expires = now_secs + LIFETIME_SECS;
        let body = format!("v1.{expires}.{id}");
        let mac = hex(&mac(token, b"session", body.as_bytes()));
        Session {
            value: format!("{body}.{mac}"),
            id,
            expires,
        }
    }

    /// The session's own name (its nonce), under which a logout ends it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// When the session expires, in seconds since the epoch.
    pub fn expires_secs(&self) -> i64 {
        self.expires
    }

    /// The session a cookie value stands for, if it was minted with
    /// `token` and has not expired at `now_secs`.
    pub fn verify(token: &ApiToken, value: &str, now_secs: i64) -> Option<Session> {
        let (body, given) = value.rsplit_once('.')?;
        let expected = hex(&mac(token, b"session", body.as_bytes()));
        if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
            return None;
        }
        let mut parts = body.split('.');
        let (Some("v1"), Some(expires), Some(id), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let expires: i64 = expires.parse().ok()?;
        (expires > now_secs).then(|| Session {
            value: value.to_string(),
            id: id.to_string(),
            expires,
        })
    }

    /// The session named by the request's cookie, if valid.
    pub fn from_headers(token: &ApiToken, headers: &HeaderMap, now_secs: i64) -> Option<Session> {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .filter(|(name, _)| *name == COOKIE)
            .find_map(|(_, value)| Session::verify(token, value, now_secs))
    }

    /// The CSRF token forms of this session carry.
    pub fn csrf(&self, token: &ApiToken) -> String {
        hex(&mac(token, b"csrf", self.value.as_bytes()))
    }

    /// Whether `given` is this session's CSRF token.
    pub fn csrf_matches(&self, token: &ApiToken, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.csrf(token).as_bytes())
    }

    /// The `Set-Cookie` value that starts this session: HttpOnly,
    /// SameSite=Strict, for `/ui` only.
    pub fn set_cookie(&self) -> String {
        format!(
            "{COOKIE}={}; Path=/ui; Max-Age={LIFETIME_SECS}; HttpOnly; SameSite=Strict",
            self.value
        )
    }
}

/// The `Set-Cookie` value that ends a session.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict")
}

/// HMAC-SHA256 keyed with the API token over a purpose and a message.
fn mac(token: &ApiToken, purpose: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(token.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(b"jobmgr dashboard v1\n");
    mac.update(purpose);
    mac.update(b"\n");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_session_verifies_until_it_expires_and_only_with_its_token() {
        let token = ApiToken::new("s3cret").unwrap();
        let session = Session::mint(&token, 1000);
        assert!(Session::verify(&token, &session.value, 1000).is_some());
        assert!(Session::verify(&token, &session.value, 1000 + LIFETIME_SECS).is_none());
        let other = ApiToken::new("other").unwrap();
        assert!(Session::verify(&other, &session.value, 1000).is_none());
        let forged = session.value.replacen("v1.", "v1.9", 1);
        assert!(Session::verify(&token, &forged, 1000).is_none());
        assert!(Session::verify(&token, "", 1000).is_none());
        assert!(Session::verify(&token, "v1.x.y", 1000).is_none());
        let again = Session::verify(&token, &session.value, 1000).unwrap();
        assert_eq!(again.id(), session.id());
        assert_eq!(again.expires_secs(), 1000 + LIFETIME_SECS);
        assert_ne!(Session::mint(&token, 1000).id(), session.id());
    }

    #[test]
    fn csrf_tokens_belong_to_their_session() {
        let token = ApiToken::new("s3cret").unwrap();
        let one = Session::mint(&token, 0);
        let two = Session::mint(&token, 0);
        let csrf = one.csrf(&token);
        assert!(one.csrf_matches(&token, &csrf));
        assert!(!two.csrf_matches(&token, &csrf));
        assert!(!one.csrf_matches(&token, ""));
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let token = ApiToken::new("s3cret").unwrap();
        let session = Session::mint(&token, 0);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("a=b; {COOKIE}=junk; {COOKIE}={}", session.value)
                .parse()
                .unwrap(),
        );
        assert!(Session::from_headers(&token, &headers, 1).is_some());
        assert!(session.set_cookie().contains("HttpOnly; SameSite=Strict"));
    }
}
