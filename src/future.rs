//! The boxed future that the crate's object-safe async traits return: the
//! job store's helpers, the job sources, the queue's test hooks. It lives
//! here, beside neither, so that clients do not reach into the server.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
