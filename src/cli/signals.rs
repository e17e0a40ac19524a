//! Signals, registered before the process says it is ready, so that a
//! signal sent right after the ready line is handled rather than killing (or
//! stopping) the process with the default action.

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;

use crate::supervisor::Control;

/// The signals jobmgr handles.
pub struct Signals {
    term: Signal,
    int: Signal,
    tstp: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers.
    pub fn register() -> std::io::Result<Self> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            tstp: signal(SignalKind::from_raw(nix::libc::SIGTSTP))?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves on SIGTERM or SIGINT, before the server serves (while it
    /// waits for its database): it stops without serving.
    pub async fn stop_requested(&mut self) {
        let name = tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stop requested before the server was ready");
    }

    /// Resolves on SIGTERM or SIGINT (the server's stop).
    pub async fn shutdown(mut self) {
        let name = tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stop requested");
        super::service::stopping("stopping: answering held requests");
    }

    /// Turns signals into the supervisor's control messages: SIGTERM/SIGINT
    /// drain (a second one stops running jobs now), SIGTSTP quiets, SIGHUP
    /// reloads.
    pub async fn forward(mut self, control: mpsc::UnboundedSender<Control>) {
        let mut drains = 0;
        loop {
            let message = tokio::select! {
                _ = self.term.recv() => Self::drain(&mut drains, "SIGTERM"),
                _ = self.int.recv() => Self::drain(&mut drains, "SIGINT"),
                _ = self.tstp.recv() => Control::Quiet,
                _ = self.hup.recv() => Control::Reload,
            };
            if control.send(message).is_err() {
                return;
            }
        }
    }

    fn drain(drains: &mut u32, name: &str) -> Control {
        *drains += 1;
        tracing::info!(signal = name, "stop requested");
        super::service::stopping(if *drains > 1 {
            "stopping running jobs now"
        } else {
            "draining: running jobs may finish"
        });
        if *drains > 1 {
            Control::StopNow
        } else {
            Control::Drain
        }
    }
}
