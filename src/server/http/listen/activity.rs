//! The clock of one HTTP connection: which phase it is in (reading a
//! request's head, serving requests, or idle between them) and since when,
//! so that a connection is closed when its head is late or it sits idle.
//!
//! hyper's own `header_read_timeout` also runs while a keep-alive
//! connection is idle, which would make the idle timeout the header
//! timeout; this keeps the two apart.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Why a connection was closed by its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// A request's head did not arrive whole in time.
    HeadLate,
    /// No request for the idle timeout.
    Idle,
}

#[derive(Debug)]
struct Phase {
    /// Requests being served (a held long-poll counts).
    in_flight: usize,
    /// Bytes of a request head have arrived and no request has started.
    reading_head: bool,
    /// When the current phase began.
    since: Instant,
}

/// What one connection is doing, shared by its reader, its requests and its
/// watchdog.
#[derive(Debug)]
pub struct Activity {
    phase: Mutex<Phase>,
    /// Told when the phase changes in a way that brings a deadline nearer:
    /// the last request in flight ends, or bytes of a new head arrive on an
    /// idle connection.
    changed: tokio::sync::Notify,
}

/// A request in progress; dropping it ends the request.
pub struct Busy(Arc<Activity>);

impl Activity {
    /// A connection just accepted: its first request head is due within the
    /// header timeout.
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            phase: Mutex::new(Phase {
                in_flight: 0,
                reading_head: true,
                since: Instant::now(),
            }),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived.
    fn on_read(&self) {
        let mut phase = self.phase();
        if phase.in_flight == 0 && !phase.reading_head {
            phase.reading_head = true;
            phase.since = Instant::now();
            // The watchdog sleeps until the idle deadline; the header
            // deadline is nearer.
            self.changed.notify_one();
        }
    }

    /// A request's head has been read and the request starts.
    pub fn begin(self: &Arc<Self>) -> Busy {
        let mut phase = self.phase();
        phase.in_flight += 1;
        phase.reading_head = false;
        Busy(Arc::clone(self))
    }

    /// Resolves when the connection has been in one phase too long: a head
    /// late by `header`, or no request for `idle`. Never while a request is
    /// in flight.
    pub async fn expired(&self, header: Duration, idle: Duration) -> Expiry {
        loop {
            let (deadline, why) = {
                let phase = self.phase();
                if phase.in_flight > 0 {
                    (None, Expiry::Idle)
                } else if phase.reading_head {
                    (Some(phase.since + header), Expiry::HeadLate)
                } else {
                    (Some(phase.since + idle), Expiry::Idle)
                }
            };
            // A change since the look above keeps its permit, so it is not
            // missed.
            match deadline {
                Some(deadline) if Instant::now() >= deadline => return why,
                Some(deadline) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                // Wait for the last request to end.
                None => self.changed.notified().await,
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        phase.in_flight -= 1;
        if phase.in_flight == 0 {
            phase.reading_head = false;
            phase.since = Instant::now();
            self.0.changed.notify_one();
        }
    }
}

/// An answer's body that keeps its request in flight until it is sent.
pub struct Kept<B> {
    inner: B,
    _busy: Busy,
}

impl<B> Kept<B> {
    /// Keeps `busy` while `inner` is sent.
    pub fn new(inner: B, busy: Busy) -> Self {
        Kept { inner, _busy: busy }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Kept<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A stream that tells its [`Activity`] when bytes arrive.
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    /// Watches `inner`.
    pub fn new(inner: S, activity: Arc<Activity>) -> Self {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_late_head_an_idle_connection_and_a_held_request_are_told_apart() {
        let header = Duration::from_secs(10);
        let idle = Duration::from_secs(60);
        let activity = Activity::new();
        let start = Instant::now();
        assert_eq!(activity.expired(header, idle).await, Expiry::HeadLate);
        assert_eq!(start.elapsed(), header);

        let busy = activity.begin();
        let held = tokio::time::timeout(idle * 3, activity.expired(header, idle)).await;
        assert!(held.is_err(), "a request in flight is never idle");
        drop(busy);
        let start = Instant::now();
        assert_eq!(activity.expired(header, idle).await, Expiry::Idle);
        assert_eq!(start.elapsed(), idle);

        activity.on_read();
        let start = Instant::now();
        assert_eq!(activity.expired(header, idle).await, Expiry::HeadLate);
        assert_eq!(start.elapsed(), header);
    }

    /// Keep-alive slowloris: after a request, the next head starts to
    /// arrive while the watchdog already waits for the idle deadline; the
    /// head is still cut at the header timeout.
    #[tokio::test(start_paused = true)]
    async fn a_head_begun_while_the_watchdog_waits_for_idle_is_cut_at_the_header_timeout() {
        let header = Duration::from_secs(2);
        let idle = Duration::from_secs(60);
        let activity = Activity::new();
        drop(activity.begin());
        let watchdog = {
            let activity = Arc::clone(&activity);
            tokio::spawn(async move { activity.expired(header, idle).await })
        };
        // The watchdog is now asleep until the idle deadline.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!watchdog.is_finished());
        let head_began = Instant::now();
        activity.on_read();
        assert_eq!(watchdog.await.expect("watchdog"), Expiry::HeadLate);
        assert_eq!(
            head_began.elapsed(),
            header,
            "cut at the header timeout, not the idle one"
        );
    }
}
