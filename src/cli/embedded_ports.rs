//! A job server's ports at start, and what to say when one is taken: the
//! defaults (127.0.0.1:8888 and :8889) are a Bedrock server's own ports, so
//! a BWM user next to a local Bedrock most likely wants `--server
//! bedrock://…` instead of the supervisor's embedded server. The Bedrock
//! address is probed (a `Ping`, with a short timeout) to say what answers
//! there. The standalone `jobmgr server` gets the same probe, and advice
//! of its own.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::server::{self, ServerError};

/// How long the probe of an occupied Bedrock address may take in all.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// What answered a `Ping` on the Bedrock address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A Bedrock server (`200` to a `Ping` without a token).
    Bedrock,
    /// A jobmgr server's Bedrock port (it wants the token).
    Jobmgr,
    /// Something that speaks the Bedrock protocol: its status line.
    Other(String),
    /// Nothing usable (refused, silent, not the protocol).
    Nothing,
}

/// Which server's port is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The supervisor's embedded server.
    Embedded,
    /// `jobmgr server`.
    Standalone,
}

/// Binds `addr` for the embedded server's `port` ("HTTP" or "Bedrock");
/// when the address is in use, the error says what probably holds it
/// (probing `bedrock_addr`) and which flags move the ports.
pub async fn bind(addr: &str, port: &str, bedrock_addr: &str) -> Result<TcpListener, ServerError> {
    bind_as(Role::Embedded, addr, port, bedrock_addr).await
}

/// [`bind`] for either server.
pub async fn bind_as(
    role: Role,
    addr: &str,
    port: &str,
    bedrock_addr: &str,
) -> Result<TcpListener, ServerError> {
    match server::bind(addr).await {
        Err(ServerError::Bind { addr, source })
            if source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            let answer = probe(bedrock_addr).await;
            let advice = match role {
                Role::Embedded => advice(port, bedrock_addr, &answer),
                Role::Standalone => standalone_advice(port, bedrock_addr, &answer),
            };
            Err(ServerError::PortTaken { advice, addr })
        }
        other => other,
    }
}

/// The advice for a taken port of `jobmgr server`.
pub fn standalone_advice(port: &str, bedrock_addr: &str, answer: &Answer) -> String {
    let found = match answer {
        Answer::Bedrock => format!(
            "a Bedrock server answers on {bedrock_addr} (supervisors can take its jobs directly, with --server bedrock://{bedrock_addr}, and need no jobmgr server)"
        ),
        Answer::Jobmgr => format!(
            "a jobmgr server already answers on {bedrock_addr} (one server per store: is this one running already?)"
        ),
        Answer::Other(status) => format!(
            "something speaking the Bedrock protocol answers on {bedrock_addr} ({status:?})"
        ),
        Answer::Nothing => "another process listens there".to_string(),
    };
    format!(
        "the server's {port} port is taken; {found}; run it on other addresses with --http ADDR and --bedrock ADDR (or \"none\"), or JOBMGR_HTTP and JOBMGR_BEDROCK"
    )
}

/// The advice for a taken port, given what answers on the Bedrock address.
pub fn advice(port: &str, bedrock_addr: &str, answer: &Answer) -> String {
    let found = match answer {
        Answer::Bedrock => format!(
            "a Bedrock server answers on {bedrock_addr}: to take its jobs, run with --server bedrock://{bedrock_addr}"
        ),
        Answer::Jobmgr => format!(
            "a jobmgr server answers on {bedrock_addr}: to take its jobs, run with --server http://HOST:PORT (its HTTP port) and its token"
        ),
        Answer::Other(status) => format!(
            "something speaking the Bedrock protocol answers on {bedrock_addr} ({status:?}); if that is a Bedrock server, run with --server bedrock://{bedrock_addr}"
        ),
        Answer::Nothing => format!(
            "these are a Bedrock server's own ports: if a Bedrock server runs here, run with --server bedrock://{bedrock_addr}"
        ),
    };
    format!(
        "the embedded server's {port} port is taken; {found}; or move the embedded server's ports with --http ADDR and --bedrock ADDR (or \"none\"), keys http and bedrock, JOBMGR_HTTP and JOBMGR_BEDROCK"
    )
}

/// Sends a Bedrock `Ping` to `addr` and reads the status line, within
/// [`PROBE_TIMEOUT`].
pub async fn probe(addr: &str) -> Answer {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"Ping\r\n\r\n").await.ok()?;
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        while !head.contains(&b'\n') && head.len() < 4096 {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&head);
        Some(text.lines().next().unwrap_or_default().trim().to_string())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
        Ok(Some(line)) => classify(&line),
        _ => Answer::Nothing,
    }
}

/// What a status line says about the server that sent it.
fn classify(line: &str) -> Answer {
    let code = line.split(' ').next().unwrap_or_default();
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Answer::Nothing;
    }
    if code == "200" {
        return Answer::Bedrock;
    }
    if line.contains("send the server's token") {
        return Answer::Jobmgr;
    }
    Answer::Other(line.chars().take(100).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standalone_server_is_told_what_holds_its_port_and_how_to_move() {
        let bedrock = standalone_advice("Bedrock", "127.0.0.1:8888", &Answer::Bedrock);
        assert!(
            bedrock.contains("--server bedrock://127.0.0.1:8888"),
            "{bedrock}"
        );
        let ours = standalone_advice("HTTP", "127.0.0.1:8888", &Answer::Jobmgr);
        assert!(ours.contains("already answers"), "{ours}");
        for text in [bedrock, ours] {
            assert!(
                text.contains("--http ADDR") && text.contains("JOBMGR_BEDROCK"),
                "{text}"
            );
        }
    }

    #[test]
    fn status_lines_are_told_apart() {
        assert_eq!(classify("200 OK"), Answer::Bedrock);
        assert_eq!(
            classify("401 Unauthorized: send the server's token in a Token header"),
            Answer::Jobmgr
        );
        assert_eq!(
            classify("404 Unknown command"),
            Answer::Other("404 Unknown command".into())
        );
        assert_eq!(classify("HTTP/1.1 400 Bad Request"), Answer::Nothing);
        assert_eq!(classify(""), Answer::Nothing);
    }
}
