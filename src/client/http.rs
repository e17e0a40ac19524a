//! A client of the HTTP/JSON API: one method per endpoint, answers as JSON
//! values, errors carrying the server's code and message.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use thiserror::Error;

use super::servers::Servers;
use crate::auth::ApiToken;

/// Why a call to the server did not succeed.
#[derive(Debug, Clone, Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The server's error code.
        code: String,
        /// The server's message.
        message: String,
    },
    /// The server could not be reached, or answered something unreadable.
    #[error("cannot reach the job server at {url}: {detail}; is `jobmgr server` running there?")]
    Transport {
        /// The URL called.
        url: String,
        /// What failed.
        detail: String,
    },
    /// The server URL is not usable.
    #[error("bad server URL {0:?}: expected http://HOST:PORT or https://HOST:PORT")]
    BadUrl(String),
    /// A list of servers is not usable.
    #[error("bad server list {list:?}: {why}")]
    BadList {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        why: String,
    },
    /// The CA certificate to trust could not be read.
    #[error("cannot use the CA certificate {path}: {detail}; pass a PEM file to --ca-cert")]
    CaCert {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        detail: String,
    },
}

impl ClientError {
    /// The server's error code, if it answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the server said the thing asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Api { status: 404, .. })
    }

    /// The server's error answer, `{"code": …, "message": …}`, with its
    /// HTTP status (a field it lacks reads as empty).
    pub(crate) fn from_answer(status: u16, answer: &Value) -> Self {
        let field = |key: &str| {
            answer
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        ClientError::Api {
            status,
            code: field("code"),
            message: field("message"),
        }
    }
}

/// A call that got no answer of the server's own.
struct Failed {
    error: ClientError,
    /// Whether the server surely did nothing, so that another may be asked.
    resend: bool,
}

/// A client of a server, or of several servers of one store.
#[derive(Debug, Clone)]
pub struct HttpClient {
    servers: std::sync::Arc<Servers>,
    token: Option<ApiToken>,
    /// Said with a `401`: where the token came from, or why none was sent.
    hint: Option<String>,
    http: reqwest::Client,
}

impl HttpClient {
    /// A client of the server at `base` (`http://127.0.0.1:8889`), sending
    /// `token` as a bearer token when given.
    pub fn new(base: &str, token: Option<ApiToken>) -> Result<Self, ClientError> {
        Self::trusting(base, token, None)
    }

    /// A client of the server at `base` that also trusts the CA
    /// certificate in the PEM file `ca_cert` (for `https://` URLs of a
    /// server whose certificate a private CA signed). `base` may list
    /// several servers of one store, separated by commas: see
    /// [`Servers`] for how one is chosen.
    pub fn trusting(
        base: &str,
        token: Option<ApiToken>,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<Self, ClientError> {
        let servers = Servers::parse(base)?;
        let base = servers.describe();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // Below the server's idle timeout (60 s by default), so that a
            // pooled connection is not reused just as the server closes it.
            .pool_idle_timeout(Duration::from_secs(30));
        if let Some(path) = ca_cert {
            let ca_error = |detail: String| ClientError::CaCert {
                path: path.to_path_buf(),
                detail,
            };
            let pem = std::fs::read(path).map_err(|e| ca_error(e.to_string()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ca_error(e.to_string()))?;
            if certs.is_empty() {
                return Err(ca_error("no CERTIFICATE block in it".into()));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| ClientError::Transport {
            url: base.clone(),
            detail: with_sources(&e),
        })?;
        Ok(HttpClient {
            servers: std::sync::Arc::new(servers),
            token,
            hint: None,
            http,
        })
    }

    /// The same client for a one-off probe: its switches between servers
    /// are not logged, since they are not the supervisor's (which keeps
    /// its own choice; a "job server switched" line from a start-up check
    /// named a server the supervisor then did not use).
    pub fn probe(mut self) -> Self {
        if let Some(servers) = std::sync::Arc::get_mut(&mut self.servers) {
            servers.quiet();
        }
        self
    }

    /// Adds `hint` to the error of a request the server refuses with `401`
    /// (see [`crate::auth::ClientToken`]).
    pub fn with_hint(mut self, hint: String) -> Self {
        self.hint = Some(hint);
        self
    }

    /// The base URL of the server in use.
    pub fn base(&self) -> &str {
        self.servers.current()
    }

    /// Every server's base URL, comma-separated.
    pub fn describe(&self) -> String {
        self.servers.describe()
    }

    /// Calls `method path` with an optional JSON body; `timeout` bounds the
    /// whole call. With several servers: a server that cannot be connected
    /// to, or answers 503 (it did nothing), is set aside and the call goes
    /// to the next; a call that failed after it was sent (a timeout, a
    /// reset) is not sent again, unless it is a GET, but the next call goes
    /// elsewhere.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, ClientError> {
        let mut last = None;
        for i in self.servers.order(std::time::Instant::now()) {
            let base = self.servers.base(i);
            match self
                .call_one(base, method.clone(), path, body, timeout)
                .await
            {
                Err(Failed { error, resend }) => {
                    self.servers.failed(i, std::time::Instant::now());
                    if !resend {
                        return Err(error);
                    }
                    last = Some(error);
                }
                Ok(answer) => {
                    self.servers.answered(i);
                    return answer;
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::BadUrl(self.servers.describe())))
    }

    /// One server's answer (`Ok`, an error of its own included), or why it
    /// gave none.
    async fn call_one(
        &self,
        base: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Result<Value, ClientError>, Failed> {
        let url = format!("{base}{path}");
        // A GET changes nothing, so any server may be asked it again.
        let safe = method == Method::GET;
        let mut request = self.http.request(method, &url).timeout(timeout);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token.expose());
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let transport = |e: reqwest::Error| Failed {
            // Not connected: nothing was sent, so another server may take it.
            resend: e.is_connect() || safe,
            error: ClientError::Transport {
                url: url.clone(),
                detail: with_sources(&e),
            },
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(transport)?;
        let value: Value = serde_json::from_str(&text).map_err(|e| Failed {
            resend: false,
            error: ClientError::Transport {
                url: url.clone(),
                detail: format!(
                    "answer is not JSON ({e}): {}",
                    text.chars().take(200).collect::<String>()
                ),
            },
        })?;
        if (200..300).contains(&status) {
            return Ok(Ok(value));
        }
        let error = self.refusal(status, &value);
        if status == 503 && self.servers.count() > 1 {
            // Its store is unavailable: it did nothing, another may.
            return Err(Failed {
                error,
                resend: true,
            });
        }
        Ok(Err(error))
    }

    /// Opens a long answer (an event stream) of `GET path` on the server in
    /// use, sending `last_event_id` as `Last-Event-ID`; the answer's body
    /// is read as it comes (`chunk()`). A refusal is the server's error.
    pub async fn open_stream(
        &self,
        path: &str,
        last_event_id: Option<&str>,
    ) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{path}", self.base());
        let mut request = self.http.get(&url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token.expose());
        }
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let transport = |e: reqwest::Error| ClientError::Transport {
            url: url.clone(),
            detail: with_sources(&e),
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let value: Value = response
            .json()
            .await
            .unwrap_or_else(|_| Value::Object(Default::default()));
        Err(self.refusal(status, &value))
    }

    /// The server's refusal, said with the hint for a `401`.
    fn refusal(&self, status: u16, answer: &Value) -> ClientError {
        let mut error = ClientError::from_answer(status, answer);
        if let (ClientError::Api { message, .. }, 401, Some(hint)) =
            (&mut error, status, &self.hint)
        {
            *message = format!("{message}. {hint}");
        }
        error
    }

    /// A call that answers within a minute.
    pub async fn quick(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        self.call(method, path, body, Duration::from_secs(60)).await
    }
}

/// An error with the chain of its causes, `outer: cause: root cause`
/// (reqwest's "error sending request for url (…)" says why only in its
/// sources, e.g. "Connection refused"). A cause whose text is already
/// shown is not repeated.
pub fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let shown = cause.to_string();
        if !shown.is_empty() && !text.contains(&shown) {
            text.push_str(": ");
            text.push_str(&shown);
        }
        source = cause.source();
    }
    text
}
