//! A TCP proxy for fault injection: it sits between a process under test
//! and its peer (a server and its PostgreSQL, a supervisor and its server),
//! forwards bytes both ways, and on demand cuts every connection and refuses
//! new ones, as a lost network or a dead peer would, until it is restored.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// What the accept loop and the test share.
#[derive(Default)]
struct Shared {
    /// Whether connections are let through.
    down: AtomicBool,
    /// The proxy is being dropped.
    stopping: AtomicBool,
    /// Both ends of every forwarded connection, by number, to shut them on
    /// a cut.
    live: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    /// The number of the next connection.
    next: std::sync::atomic::AtomicU64,
}

/// A proxy on a port of 127.0.0.1 from the OS, to one target address.
pub struct FaultProxy {
    addr: String,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts forwarding connections on a new port to `target` (`host:port`).
    pub fn start(target: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        let addr = listener.local_addr().unwrap().to_string();
        let shared = Arc::new(Shared::default());
        let target = target.to_string();
        let accepting = Arc::clone(&shared);
        thread::spawn(move || {
            for incoming in listener.incoming() {
                if accepting.stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = incoming else { continue };
                if accepting.down.load(Ordering::SeqCst) {
                    // Refused: closed at once, as a peer that is gone.
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                forward(&accepting, client, server);
            }
        });
        FaultProxy { addr, shared }
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Cuts every forwarded connection and refuses new ones until
    /// [`restore`](Self::restore).
    pub fn cut(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        for (_, client, server) in self.shared.live.lock().unwrap().drain(..) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.shared.down.store(false, Ordering::SeqCst);
    }

    /// How many connections are being forwarded.
    pub fn connections(&self) -> usize {
        self.shared.live.lock().unwrap().len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.cut();
        // Wakes the accept loop so that it sees `stopping`.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Copies bytes both ways between `client` and `server` on two threads,
/// keeping clones of both so that a cut can shut them.
fn forward(shared: &Arc<Shared>, client: TcpStream, server: TcpStream) {
    let (Ok(client_copy), Ok(server_copy)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let number = shared.next.fetch_add(1, Ordering::SeqCst);
    shared
        .live
        .lock()
        .unwrap()
        .push((number, client_copy, server_copy));
    for (from, to) in [(&client, &server), (&server, &client)] {
        let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
            continue;
        };
        let shared = Arc::clone(shared);
        thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            shared.live.lock().unwrap().retain(|(n, _, _)| *n != number);
        });
    }
}
