//! Clients of a job server. [`HttpClient`] speaks the HTTP/JSON API; the
//! [`JobSource`] trait is what the supervisor needs from any server, with
//! implementations over HTTP, Bedrock's protocol, and in-process.

mod bedrock;
mod http;
mod http_source;
mod local;
mod report_batch;
mod riders;
mod servers;
mod source;

pub use bedrock::BedrockSource;
pub use http::{ClientError, HttpClient, with_sources};
pub use http_source::HttpSource;
pub use local::LocalSource;
pub use source::{FetchMode, JobSource, LeasedJob, Report, SourceError};
