//! Browser safety, after Redis's protected mode: a web page can never drive
//! the API. A browser lets any page send requests to any address, loopback
//! included; three checks make sure such requests do nothing.
//!
//! - **Host.** A page that rebinds its own domain to this server's address
//!   (DNS rebinding) sends that domain as `Host`. Accepted are address
//!   literals of this server (the bound address; any loopback address when
//!   bound to loopback; any address when bound to `0.0.0.0` or `::`),
//!   `localhost`, and names given with `--allowed-host` (`*` for any). The
//!   port is not compared: a rebinding page uses the server's port anyway.
//!   A request without `Host` (HTTP/1.0) is accepted: browsers always send
//!   one. `/healthz` skips this check, for health checkers that name the
//!   host as they please.
//! - **Origin.** Browsers send `Origin` with every cross-site request that
//!   could change something. A request carrying one is refused unless it is
//!   listed with `--allowed-origin` (`*` for any) or names this server
//!   itself (the same host and port as an accepted `Host`).
//! - **Content type.** A page can send a body without asking the server
//!   first only as `text/plain`, a form or multipart. Every request with a
//!   body, or with a `Content-Type`, must say `application/json`; under
//!   `/ui/` (the dashboard, whose forms carry a CSRF token, see
//!   [`super::ui`]) it must say `application/x-www-form-urlencoded`.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use thiserror::Error;

use super::error::ApiError;

/// Which `Host` and `Origin` headers the API accepts, beyond its own.
#[derive(Debug, Clone, Default)]
pub struct BrowserPolicy {
    /// Lower-cased host names (no port); `*` accepts any.
    hosts: Vec<String>,
    /// Lower-cased origins (`scheme://host[:port]`); `*` accepts any.
    origins: Vec<String>,
    /// The address the API listens on, once bound.
    bound: Option<SocketAddr>,
}

/// An `--allowed-host` or `--allowed-origin` that cannot be right.
#[derive(Debug, Error)]
pub enum PolicyError {
    /// A host name with a scheme, path or port.
    #[error(
        "--allowed-host {0:?} is not a host name: give the name alone, such as jobs.example.com (no scheme, port or path), or * for any"
    )]
    BadHost(String),
    /// An origin that is not `scheme://host[:port]`.
    #[error(
        "--allowed-origin {0:?} is not an origin: give scheme://host[:port] as a browser sends it, such as https://ops.example.com, or * for any"
    )]
    BadOrigin(String),
}

impl BrowserPolicy {
    /// A policy that also accepts these host names and origins.
    pub fn new(hosts: Vec<String>, origins: Vec<String>) -> Result<Self, PolicyError> {
        let hosts = hosts
            .into_iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .map(|h| {
                let bad = h.contains(['/', '@', ' ']) || (h.contains(':') && !h.starts_with('['));
                if bad && h.parse::<IpAddr>().is_err() {
                    Err(PolicyError::BadHost(h))
                } else {
                    Ok(normal_host(&h))
                }
            })
            .collect::<Result<_, _>>()?;
        let origins = origins
            .into_iter()
            .map(|o| o.trim().to_string())
            .filter(|o| !o.is_empty())
            .map(|o| {
                let normal = o.trim_end_matches('/').to_ascii_lowercase();
                let shaped = normal == "*"
                    || normal.split_once("://").is_some_and(|(scheme, rest)| {
                        !scheme.is_empty() && !rest.is_empty() && !rest.contains('/')
                    });
                if shaped {
                    Ok(normal)
                } else {
                    Err(PolicyError::BadOrigin(o))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(BrowserPolicy {
            hosts,
            origins,
            bound: None,
        })
    }

    /// The host names accepted besides the server's own.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// This policy for an API listening on `addr`.
    pub fn bound_to(&self, addr: SocketAddr) -> Self {
        BrowserPolicy {
            bound: Some(addr),
            ..self.clone()
        }
    }

    /// Whether `Host: value` names this server.
    fn host_ok(&self, value: &str) -> bool {
        let host = normal_host(value);
        if self.hosts.iter().any(|h| h == "*" || *h == host) || host == "localhost" {
            return true;
        }
        let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        else {
            return false;
        };
        match self.bound {
            None => false,
            Some(bound) => {
                let own = bound.ip();
                own.is_unspecified() || own == ip || (own.is_loopback() && ip.is_loopback())
            }
        }
    }

    /// Whether `Origin: value` may call the API, given the request's `Host`.
    fn origin_ok(&self, value: &str, host: Option<&str>) -> bool {
        let origin = value.trim_end_matches('/').to_ascii_lowercase();
        if self.origins.iter().any(|o| o == "*" || *o == origin) {
            return true;
        }
        // The server's own pages: the origin names the host and port the
        // request was sent to (and that host passed the Host check).
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        matches!((authority, host), (Some(a), Some(h)) if a == h.to_ascii_lowercase())
    }

    /// The refusal for a request, if it is refused.
    fn check(&self, headers: &HeaderMap, path: &str) -> Result<(), ApiError> {
        let host = match headers.get(header::HOST) {
            None => None,
            Some(value) => Some(value.to_str().map_err(|_| foreign_host("(not text)"))?),
        };
        if path != "/healthz"
            && let Some(host) = host
            && !self.host_ok(host)
        {
            return Err(foreign_host(host));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("(not text)");
            if !self.origin_ok(origin, host) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "foreign_origin",
                    format!(
                        "requests from web pages are refused (Origin: {origin}); to let the pages of {origin} call this API, start the server with --allowed-origin {origin}"
                    ),
                ));
            }
        }
        if path.starts_with("/ui/") {
            check_form_content_type(headers)
        } else {
            check_content_type(headers)
        }
    }
}

/// A host name as compared: lower case, no port, no trailing dot.
fn normal_host(value: &str) -> String {
    let value = value.trim().to_ascii_lowercase();
    let name = if value.starts_with('[') {
        // [v6]:port
        match value.find(']') {
            Some(end) => value[..=end].to_string(),
            None => value,
        }
    } else if value.matches(':').count() == 1 {
        value.split(':').next().unwrap_or_default().to_string()
    } else {
        value
    };
    name.trim_end_matches('.').to_string()
}

fn foreign_host(host: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "foreign_host",
        format!(
            "this server does not answer to the host {host:?}; call it by its address or localhost, or start it with --allowed-host NAME to accept that name"
        ),
    )
}

/// Refuses a dashboard body that is not a form.
fn check_form_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    if !has_body(headers) && !headers.contains_key(header::CONTENT_TYPE) {
        return Ok(());
    }
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| {
            media
                .trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if form {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the dashboard takes forms only (`Content-Type: application/x-www-form-urlencoded`); \
             the JSON API is outside /ui",
        ))
    }
}

/// Whether a request has a body.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// Refuses a body that is not declared `application/json`.
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    let declared = headers.get(header::CONTENT_TYPE);
    if !has_body && declared.is_none() {
        return Ok(());
    }
    let json = declared
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if json {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "request bodies must be JSON sent with `Content-Type: application/json`",
        ))
    }
}

/// The middleware: refuses what a browser page could have sent.
pub async fn guard(State(policy): State<BrowserPolicy>, request: Request, next: Next) -> Response {
    if let Err(refusal) = policy.check(request.headers(), request.uri().path()) {
        tracing::info!(code = %refusal.code, path = %request.uri().path(), "HTTP request refused: {}", refusal.message);
        return refusal.into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(bound: &str) -> BrowserPolicy {
        BrowserPolicy::default().bound_to(bound.parse().unwrap())
    }

    #[test]
    fn hosts_are_the_servers_own_addresses_and_listed_names() {
        let local = policy("127.0.0.1:8889");
        for ok in [
            "127.0.0.1:8889",
            "127.0.0.1",
            "localhost:8889",
            "LOCALHOST.",
            "[::1]:8889",
        ] {
            assert!(local.host_ok(ok), "{ok}");
        }
        for refused in ["evil.example:8889", "10.0.0.1:8889", "127.0.0.1.nip.io"] {
            assert!(!local.host_ok(refused), "{refused}");
        }
        let any = policy("0.0.0.0:8889");
        assert!(any.host_ok("10.1.2.3:8889"));
        assert!(!any.host_ok("jobs.example.com"));
        let named = BrowserPolicy::new(vec!["Jobs.Example.com".into()], vec![])
            .unwrap()
            .bound_to("0.0.0.0:1".parse().unwrap());
        assert!(named.host_ok("jobs.example.com:8889"));
        let star = BrowserPolicy::new(vec!["*".into()], vec![]).unwrap();
        assert!(star.host_ok("whatever"));
    }

    #[test]
    fn origins_are_listed_or_the_servers_own() {
        let p = BrowserPolicy::new(vec![], vec!["https://ops.example.com/".into()]).unwrap();
        assert!(p.origin_ok("https://ops.example.com", Some("127.0.0.1:1")));
        assert!(!p.origin_ok("https://evil.example", Some("127.0.0.1:1")));
        assert!(!p.origin_ok("null", Some("127.0.0.1:1")));
        assert!(p.origin_ok("http://127.0.0.1:1", Some("127.0.0.1:1")));
        assert!(!p.origin_ok("http://127.0.0.1:3000", Some("127.0.0.1:1")));
        assert!(!p.origin_ok("http://127.0.0.1:1", None));
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(BrowserPolicy::new(vec!["http://x".into()], vec![]).is_err());
        assert!(BrowserPolicy::new(vec!["x:80".into()], vec![]).is_err());
        assert!(BrowserPolicy::new(vec!["::1".into()], vec![]).is_ok());
        assert!(BrowserPolicy::new(vec![], vec!["ops.example.com".into()]).is_err());
        assert!(BrowserPolicy::new(vec![], vec!["https://x/path".into()]).is_err());
    }

    #[test]
    fn bodies_must_be_declared_json() {
        let mut headers = HeaderMap::new();
        assert!(check_content_type(&headers).is_ok(), "no body");
        headers.insert(header::CONTENT_LENGTH, "5".parse().unwrap());
        assert!(check_content_type(&headers).is_err(), "undeclared body");
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(check_content_type(&headers).is_err(), "text/plain");
        headers.insert(
            header::CONTENT_TYPE,
            "Application/JSON; charset=utf-8".parse().unwrap(),
        );
        assert!(check_content_type(&headers).is_ok());
        let mut empty_form = HeaderMap::new();
        empty_form.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(check_content_type(&empty_form).is_err(), "declared, empty");
    }
}
