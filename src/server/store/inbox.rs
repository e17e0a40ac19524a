//! The queue of write operations in front of a store's writer thread, which
//! both stores share: operations wait in it in order, and once it is closed
//! (the store shutting down) they are answered `ShuttingDown` without
//! running.

use std::sync::Mutex;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::WriteOp;
use super::sqlite::FailingTx;
use crate::protocol::JobError;

/// How long closing waits for the writer to finish what it has.
const CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A writer thread and the queue it takes its operations from.
pub(super) struct Inbox {
    sender: Mutex<Option<mpsc::Sender<WriteOp>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Inbox {
    /// Starts `run` on a thread named `name`, taking operations from the
    /// inbox until it is closed.
    pub(super) fn start(
        name: &str,
        run: impl FnOnce(mpsc::Receiver<WriteOp>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel::<WriteOp>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(receiver))?;
        Ok(Inbox {
            sender: Mutex::new(Some(sender)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues `op` for the writer, or answers it `ShuttingDown`.
    pub(super) fn submit(&self, op: WriteOp) {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        match sender.as_ref() {
            Some(sender) => {
                if let Err(mpsc::SendError(op)) = sender.send(op) {
                    refuse(op, JobError::ShuttingDown);
                }
            }
            None => refuse(op, JobError::ShuttingDown),
        }
    }

    /// Takes no more operations, lets the writer finish those queued, and
    /// waits for it, for up to [`CLOSE_WITHIN`]: a writer stuck on a store
    /// that stopped answering is left behind (its operations were not
    /// answered, so nothing acknowledged is lost) rather than holding the
    /// process's exit.
    pub(super) fn close(&self) {
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let until = std::time::Instant::now() + CLOSE_WITHIN;
        while !thread.is_finished() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            tracing::error!(
                secs = CLOSE_WITHIN.as_secs(),
                "the job store's writer did not finish its operations in time; stopping without it (they were not answered)"
            );
        }
    }
}

/// `first` and the operations queued behind it, up to `max` in all: what
/// a writer commits together.
pub(super) fn gather<T>(first: T, receiver: &mpsc::Receiver<T>, max: usize) -> Vec<T> {
    let mut group = vec![first];
    while group.len() < max {
        match receiver.try_recv() {
            Ok(op) => group.push(op),
            Err(_) => break,
        }
    }
    group
}

/// Answers an operation that cannot run.
pub(super) fn refuse(op: WriteOp, error: JobError) {
    let (_, reply) = op(&mut FailingTx(error.clone()));
    reply(Some(error));
}
