//! Job tokens: a credential scoped to one running job, for workers that
//! create child jobs through a Bedrock client on the job server's Bedrock
//! port (PHP workers migrated from BedrockWorkerManager use `$bedrock`).
//! Workers are not trusted with the API token; a supervisor gives such a
//! worker a job token instead, minted from the API token for the hand-out
//! it runs.
//!
//! - **Format.** `job.<jobID>.<mac>`: the job id in decimal (no sign, no
//!   leading zeros) and 64 lowercase hex digits of HMAC-SHA256, keyed with
//!   the API token's bytes, over
//!   `"jobmgr job token v1\n<jobID>\n<lease token>"`, where the lease token
//!   is the one the hand-out carries (`lease`), as the store keeps it.
//!   Anything else (uppercase hex, `+7`, `007`, a missing or extra part) is
//!   not a job token.
//! - **Bound to one hand-out.** The server recomputes the MAC from the
//!   job's current lease: once the job is reported, or its lease lapsed and
//!   it was handed out again (a new lease token), the token no longer
//!   verifies. Nothing is stored and nothing needs revoking; changing the
//!   API token voids every job token.
//! - **What it allows** is the Bedrock port's business
//!   ([`crate::server::bedrock`]): creating jobs (children of its own job
//!   only) and querying its own job and its children. The HTTP port and the
//!   metrics address do not accept job tokens, only the API token.
//!
//! A job token is a secret like the API token: [`JobToken`]'s `Debug` hides
//! its MAC, and the server never logs it.

use std::fmt::{self, Write};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{ApiToken, constant_time_eq};

/// What every job token starts with.
pub const PREFIX: &str = "job.";

/// The MAC's length in bytes (SHA-256's output).
const MAC_BYTES: usize = 32;

/// The most digits a job id may have (`i64::MAX` has 19).
const MAX_ID_DIGITS: usize = 19;

/// The job token for the hand-out of job `job_id` under the lease token
/// `lease`, minted with the server's `api_token`: what a supervisor gives
/// the worker that runs that hand-out.
pub fn mint(api_token: &ApiToken, job_id: i64, lease: &str) -> String {
    let mac = mac(api_token, job_id, lease);
    let mut token = String::with_capacity(PREFIX.len() + MAX_ID_DIGITS + 2 + 2 * MAC_BYTES);
    let _ = write!(token, "{PREFIX}{job_id}.");
    for byte in mac {
        let _ = write!(token, "{byte:02x}");
    }
    token
}

/// A job token as read from a request: the job it names and its MAC, not
/// yet verified. Its `Debug` hides the MAC.
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken {
    job_id: i64,
    mac: [u8; MAC_BYTES],
}

impl fmt::Debug for JobToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobToken(job {}, <hidden>)", self.job_id)
    }
}

impl JobToken {
    /// Reads `text` as a job token; `None` unless it has exactly the
    /// module's format.
    pub fn parse(text: &str) -> Option<JobToken> {
        let rest = text.strip_prefix(PREFIX)?;
        let (id, hex) = rest.split_once('.')?;
        let canonical = !id.is_empty()
            && id.len() <= MAX_ID_DIGITS
            && id.bytes().all(|b| b.is_ascii_digit())
            && !id.starts_with('0');
        if !canonical {
            return None;
        }
        let job_id = id.parse::<i64>().ok()?;
        if hex.len() != 2 * MAC_BYTES {
            return None;
        }
        let mut mac = [0u8; MAC_BYTES];
        for (byte, pair) in mac.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            *byte = (lower_hex_digit(pair[0])? << 4) | lower_hex_digit(pair[1])?;
        }
        Some(JobToken { job_id, mac })
    }

    /// The job it names (which says nothing until [`JobToken::verify`]).
    pub fn job_id(&self) -> i64 {
        self.job_id
    }

    /// Whether it was minted by `api_token` for its job's hand-out under
    /// the lease token `lease`, compared in constant time.
    pub fn verify(&self, api_token: &ApiToken, lease: &str) -> bool {
        constant_time_eq(&mac(api_token, self.job_id, lease), &self.mac)
    }
}

/// The value of a lowercase hex digit.
fn lower_hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// HMAC-SHA256 keyed with the API token over the module's message.
fn mac(api_token: &ApiToken, job_id: i64, lease: &str) -> [u8; MAC_BYTES] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(api_token.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(b"jobmgr job token v1\n");
    mac.update(job_id.to_string().as_bytes());
    mac.update(b"\n");
    mac.update(lease.as_bytes());
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: &str = "0123456789abcdef0123456789abcdef";

    fn api() -> ApiToken {
        ApiToken::new("s3cret").unwrap()
    }

    #[test]
    fn the_format_is_pinned_to_an_independent_hmac() {
        // python3: hmac.new(b"s3cret",
        //   b"jobmgr job token v1\n42\n0123456789abcdef0123456789abcdef",
        //   hashlib.sha256).hexdigest()
        assert_eq!(
            mint(&api(), 42, LEASE),
            "job.42.0163dfee59990ff504387a15d2b88616fa8566d5494936c35da3b8ddda11f04f"
        );
    }

    #[test]
    fn a_minted_token_parses_and_verifies_for_its_job_and_lease_only() {
        let text = mint(&api(), 42, LEASE);
        let token = JobToken::parse(&text).unwrap();
        assert_eq!(token.job_id(), 42);
        assert!(token.verify(&api(), LEASE));
        // Another lease (the job handed out again), another server's token.
        assert!(!token.verify(&api(), "ffffffffffffffffffffffffffffffff"));
        assert!(!token.verify(&api(), ""));
        assert!(!token.verify(&ApiToken::new("s3crett").unwrap(), LEASE));
        // The same MAC under another job id.
        let moved = text.replacen("job.42.", "job.43.", 1);
        assert!(!JobToken::parse(&moved).unwrap().verify(&api(), LEASE));
        // The largest id round-trips.
        let big = mint(&api(), i64::MAX, LEASE);
        assert_eq!(JobToken::parse(&big).unwrap().job_id(), i64::MAX);
        assert!(JobToken::parse(&big).unwrap().verify(&api(), LEASE));
    }

    #[test]
    fn every_tampered_digit_is_refused() {
        let text = mint(&api(), 7, LEASE);
        let start = text.rfind('.').unwrap() + 1;
        for at in start..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
            let tampered = String::from_utf8(bytes).unwrap();
            let token = JobToken::parse(&tampered).unwrap();
            assert!(!token.verify(&api(), LEASE), "{tampered}");
        }
    }

    #[test]
    fn malformed_tokens_do_not_parse() {
        let hex = "a".repeat(64);
        for text in [
            String::new(),
            "job.".into(),
            "job..".into(),
            "job.x.y".into(),
            "job.1".into(),
            format!("job.{hex}"),
            format!("job..{hex}"),
            format!("job.x.{hex}"),
            format!("job.-1.{hex}"),
            format!("job.+1.{hex}"),
            format!("job.0.{hex}"),
            format!("job.007.{hex}"),
            format!("job. 1.{hex}"),
            format!("job.1.{hex}."),
            format!("job.1.{hex}0"),
            format!("job.1.{}", &hex[1..]),
            format!("job.1.{}", "A".repeat(64)),
            format!("job.1.{}g", &hex[1..]),
            format!("job.1.{}é", &hex[2..]),
            format!("job.1.1.{hex}"),
            format!("JOB.1.{hex}"),
            format!("jobs.1.{hex}"),
            format!(" job.1.{hex}"),
            // Too large for 64 bits, and absurdly long.
            format!("job.9223372036854775808.{hex}"),
            format!("job.99999999999999999999.{hex}"),
            format!("job.{}.{hex}", "9".repeat(10_000)),
        ] {
            assert_eq!(JobToken::parse(&text), None, "{text:?}");
        }
        assert!(JobToken::parse(&format!("job.1.{hex}")).is_some());
    }

    #[test]
    fn the_mac_never_shows_in_debug() {
        let text = mint(&api(), 42, LEASE);
        let shown = format!("{:?}", JobToken::parse(&text).unwrap());
        assert!(shown.contains("42"), "{shown}");
        assert!(!shown.contains(&text[7..]), "{shown}");
    }
}
