//! The one thread workers are forked from. `PR_SET_PDEATHSIG` fires when the
//! *thread* that forked a child exits, so forking from a pool thread that
//! retires when idle would kill workers at random. Every spawn goes through
//! this thread, which lives as long as the supervisor.

use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

type Spawn = (Command, oneshot::Sender<std::io::Result<Child>>);

/// The spawning thread.
#[derive(Debug, Clone)]
pub struct Launcher {
    requests: mpsc::Sender<Spawn>,
}

impl Launcher {
    /// Starts the thread; children it spawns belong to the runtime of
    /// `runtime`.
    pub fn start(runtime: tokio::runtime::Handle) -> std::io::Result<Self> {
        let (requests, incoming) = mpsc::channel::<Spawn>();
        std::thread::Builder::new()
            .name("jobmgr-launcher".into())
            .spawn(move || {
                let _runtime = runtime.enter();
                while let Ok((mut command, answer)) = incoming.recv() {
                    let _ = answer.send(command.spawn());
                }
            })?;
        Ok(Launcher { requests })
    }

    /// Spawns `command` on the launcher thread.
    pub async fn spawn(&self, command: Command) -> std::io::Result<Child> {
        let (answer, answered) = oneshot::channel();
        self.requests
            .send((command, answer))
            .map_err(|_| std::io::Error::other("the launcher thread is gone"))?;
        answered
            .await
            .map_err(|_| std::io::Error::other("the launcher thread is gone"))?
    }
}
