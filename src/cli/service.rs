//! Talks to systemd when it started jobmgr as a `Type=notify` service:
//! readiness once the ports are open, watchdog pings while the runtime is
//! alive, and "stopping" when a drain begins. Outside systemd
//! (`NOTIFY_SOCKET` unset) every call does nothing.

use sd_notify::NotifyState;

/// Sends `states` to `$NOTIFY_SOCKET`, as `sd_notify::notify` does but
/// without blocking: the watchdog pings from an async thread, and a
/// service manager that does not read its socket must not stall it (nor,
/// with it, the runtime's timers). A message that finds the socket's queue
/// full is dropped.
fn notify(states: &[NotifyState<'_>]) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let message: String = states.iter().map(|state| format!("{state}\n")).collect();
    let sent = std::os::unix::net::UnixDatagram::unbound().and_then(|socket| {
        socket.set_nonblocking(true)?;
        socket.connect(&path)?;
        socket.send(message.as_bytes())
    });
    match sent {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
            tracing::debug!("the service manager's socket is full; notification dropped")
        }
        Err(error) => tracing::warn!(%error, "cannot notify the service manager"),
    }
}

/// Tells systemd the service is ready, with a one-line status.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells systemd the service is stopping (a drain has begun).
pub fn stopping(status: &str) {
    notify(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// When systemd asked for a watchdog (`WatchdogSec=`), pings it at half the
/// interval from the async runtime, so that a runtime that stops making
/// progress stops the pings and systemd restarts the service.
pub fn keep_watchdog() {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    tracing::info!(?interval, "systemd watchdog enabled");
    tokio::spawn(async move {
        loop {
            notify(&[NotifyState::Watchdog]);
            tokio::time::sleep(interval / 2).await;
        }
    });
}
