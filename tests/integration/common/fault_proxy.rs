//! A TCP proxy for fault injection: it sits between a process under test
//! and its peer (a server and its PostgreSQL, a supervisor and its server),
//! forwards bytes both ways, and on demand cuts every connection and refuses
//! new ones, as a lost network or a dead peer would, until it is restored.
//! In front of PostgreSQL it can also read each connection's startup
//! message, and refuse or cut only the connections of one
//! `application_name` (a server's listener, say).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// A forwarded connection: its number, both ends (to shut them on a cut),
/// and its `application_name` if it is a PostgreSQL connection.
struct Live {
    number: u64,
    client: TcpStream,
    server: TcpStream,
    application: Option<String>,
}

/// What the accept loop and the test share.
#[derive(Default)]
struct Shared {
    /// Whether connections are let through.
    down: AtomicBool,
    /// The proxy is being dropped.
    stopping: AtomicBool,
    /// Every forwarded connection.
    live: Mutex<Vec<Live>>,
    /// The number of the next connection.
    next: std::sync::atomic::AtomicU64,
    /// The `application_name`s whose new connections are refused.
    refused: Mutex<HashSet<String>>,
    /// How many connections were refused, by `application_name` (`""`
    /// for none or not read).
    refusals: Mutex<std::collections::HashMap<String, usize>>,
}

/// A proxy on a port of 127.0.0.1 from the OS, to one target address.
pub struct FaultProxy {
    addr: String,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts forwarding connections on a new port to `target` (`host:port`).
    pub fn start(target: &str) -> FaultProxy {
        Self::start_reading(target, false)
    }

    /// As [`start`](Self::start), to a PostgreSQL at `target`: each
    /// connection's startup message is read first, so that connections
    /// can be refused or cut by their `application_name`.
    pub fn start_postgres(target: &str) -> FaultProxy {
        Self::start_reading(target, true)
    }

    fn start_reading(target: &str, postgres: bool) -> FaultProxy {
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
                if postgres {
                    // The startup message may come slowly: not on the
                    // accept loop.
                    let shared = Arc::clone(&accepting);
                    let target = target.clone();
                    thread::spawn(move || {
                        let Some((startup, application)) = read_startup(&client) else {
                            let _ = client.shutdown(Shutdown::Both);
                            return;
                        };
                        let _ = admit(&shared, client, &target, &startup, Some(application));
                    });
                } else {
                    let _ = admit(&accepting, client, &target, &[], None);
                }
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
        for live in self.shared.live.lock().unwrap().drain(..) {
            let _ = live.client.shutdown(Shutdown::Both);
            let _ = live.server.shutdown(Shutdown::Both);
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

    /// Refuses new connections of `application` (a proxy from
    /// [`start_postgres`](Self::start_postgres)) until
    /// [`allow`](Self::allow); those forwarded already go on.
    pub fn refuse(&self, application: &str) {
        self.shared
            .refused
            .lock()
            .unwrap()
            .insert(application.to_string());
    }

    /// Lets connections of `application` through again.
    pub fn allow(&self, application: &str) {
        self.shared.refused.lock().unwrap().remove(application);
    }

    /// Cuts the forwarded connections of `application`; returns how many.
    pub fn cut_application(&self, application: &str) -> usize {
        let mut live = self.shared.live.lock().unwrap();
        let (cut, kept): (Vec<Live>, Vec<Live>) = live
            .drain(..)
            .partition(|l| l.application.as_deref() == Some(application));
        *live = kept;
        for l in &cut {
            let _ = l.client.shutdown(Shutdown::Both);
            let _ = l.server.shutdown(Shutdown::Both);
        }
        cut.len()
    }

    /// How many connections of `application` are being forwarded.
    pub fn connections_of(&self, application: &str) -> usize {
        self.shared
            .live
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.application.as_deref() == Some(application))
            .count()
    }

    /// How many connections of `application` were refused so far.
    pub fn refusals_of(&self, application: &str) -> usize {
        self.shared
            .refusals
            .lock()
            .unwrap()
            .get(application)
            .copied()
            .unwrap_or(0)
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

/// Refuses `client` (closed at once, as a peer that is gone) if the proxy
/// is down or refuses its application; else connects it to `target`,
/// sends on what was read of it already, and forwards.
fn admit(
    shared: &Arc<Shared>,
    client: TcpStream,
    target: &str,
    read: &[u8],
    application: Option<String>,
) -> Option<()> {
    let refused = shared.down.load(Ordering::SeqCst)
        || application
            .as_ref()
            .is_some_and(|name| shared.refused.lock().unwrap().contains(name));
    if refused || shared.stopping.load(Ordering::SeqCst) {
        *shared
            .refusals
            .lock()
            .unwrap()
            .entry(application.unwrap_or_default())
            .or_default() += 1;
        let _ = client.shutdown(Shutdown::Both);
        return None;
    }
    let mut server = TcpStream::connect(target).ok()?;
    server.write_all(read).ok()?;
    forward(shared, client, server, application);
    Some(())
}

/// Reads a PostgreSQL startup message from `client`: its bytes, and the
/// `application_name` it names (`""` if none). `None` if it does not come
/// within a few seconds or is not one.
fn read_startup(mut client: &TcpStream) -> Option<(Vec<u8>, String)> {
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut header = [0u8; 4];
    client.read_exact(&mut header).ok()?;
    let length = u32::from_be_bytes(header) as usize;
    if !(8..=10_000).contains(&length) {
        return None;
    }
    let mut message = header.to_vec();
    message.resize(length, 0);
    client.read_exact(&mut message[4..]).ok()?;
    client.set_read_timeout(None).ok()?;
    // Protocol 3.0's parameters: name NUL value NUL ..., then NUL.
    let mut application = String::new();
    if message[4..8] == 196_608u32.to_be_bytes() {
        let mut fields = message[8..].split(|b| *b == 0);
        while let (Some(key), Some(value)) = (fields.next(), fields.next()) {
            if key == b"application_name" {
                application = String::from_utf8_lossy(value).into_owned();
            }
        }
    }
    Some((message, application))
}

/// Copies bytes both ways between `client` and `server` on two threads,
/// keeping clones of both so that a cut can shut them.
fn forward(
    shared: &Arc<Shared>,
    client: TcpStream,
    server: TcpStream,
    application: Option<String>,
) {
    let (Ok(client_copy), Ok(server_copy)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let number = shared.next.fetch_add(1, Ordering::SeqCst);
    shared.live.lock().unwrap().push(Live {
        number,
        client: client_copy,
        server: server_copy,
        application,
    });
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
            shared.live.lock().unwrap().retain(|l| l.number != number);
        });
    }
}
