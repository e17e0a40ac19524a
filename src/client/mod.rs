//! Clients of a job server. [`HttpClient`] speaks the HTTP/JSON API.

mod http;

pub use http::{ClientError, HttpClient};
