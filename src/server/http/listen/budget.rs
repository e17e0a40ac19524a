//! Request bodies read within bounds: a per-request size limit, a deadline
//! counted from the request's head, and one byte budget shared by the whole
//! server, drawn on while a body is read and held until its request ends.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::Semaphore;

pub use crate::server::budget::Holding;

/// Bytes of each request's body that do not draw on the shared budget, so
/// that small requests are served while big uploads hold all of it.
pub const FREE_BODY: usize = 64 * 1024;

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Longer than its route allows.
    #[error("request body is larger than {limit} bytes; job data is limited to 1 MiB")]
    TooLarge {
        /// The route's limit.
        limit: usize,
    },
    /// The server holds as many request bytes as its budget allows.
    #[error(
        "the server is holding as many request bytes as its budget allows (--http-body-budget); retry shortly"
    )]
    OverBudget,
    /// Not whole within the body timeout.
    #[error("request body did not arrive whole within {0:?} of its headers (--http-body-timeout)")]
    TimedOut(Duration),
    /// The connection failed.
    #[error("request body could not be read: {0}")]
    Read(#[from] hyper::Error),
}

/// KiB that cover `bytes` beyond [`FREE_BODY`].
pub fn kib_beyond_free(bytes: usize) -> usize {
    bytes.saturating_sub(FREE_BODY).div_ceil(1024)
}

/// A request body that keeps to its limit, deadline and budget while read.
pub struct Bounded<B> {
    inner: B,
    limit: usize,
    read: usize,
    budget: Arc<Semaphore>,
    holding: Holding,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    complete: Arc<AtomicBool>,
}

impl<B: Body> Bounded<B> {
    /// Bounds `inner`: at most `limit` bytes, whole within `timeout`,
    /// drawing on `budget` into `holding`.
    pub fn new(
        inner: B,
        limit: usize,
        timeout: Duration,
        budget: Arc<Semaphore>,
        holding: Holding,
    ) -> Self {
        let complete = Arc::new(AtomicBool::new(inner.is_end_stream()));
        Bounded {
            inner,
            limit,
            read: 0,
            budget,
            holding,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            complete,
        }
    }

    /// Set once the body has been read to its end: until then, the
    /// connection cannot carry another request.
    pub fn complete(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.complete)
    }
}

impl<B> Body for Bounded<B>
where
    B: Body<Data = Bytes, Error = hyper::Error> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(BodyError::TimedOut(this.timeout))));
                }
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.read += data.len();
                    if this.read > this.limit {
                        return Poll::Ready(Some(Err(BodyError::TooLarge { limit: this.limit })));
                    }
                    let needed = kib_beyond_free(this.read).saturating_sub(this.holding.kib());
                    if !this.holding.take(&this.budget, needed) {
                        return Poll::Ready(Some(Err(BodyError::OverBudget)));
                    }
                }
                if this.inner.is_end_stream() {
                    this.complete.store(true, Ordering::Release);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(BodyError::Read(error)))),
            Poll::Ready(None) => {
                this.complete.store(true, Ordering::Release);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that holds its request's share of the budget until it
/// has been sent (or dropped).
pub struct Held<B> {
    inner: B,
    _holding: Holding,
}

impl<B> Held<B> {
    /// Holds `holding` while `inner` is sent.
    pub fn new(inner: B, holding: Holding) -> Self {
        Held {
            inner,
            _holding: holding,
        }
    }
}

impl<B: Body + Unpin> Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
