//! The messages between the supervisor and its spawner: one message per
//! `SOCK_SEQPACKET` record, fields in a plain binary layout (little-endian
//! integers, length-prefixed byte strings), descriptors alongside as
//! `SCM_RIGHTS`. Pure encoding: no I/O.

use std::io;

use crate::supervisor::yielding::WorkerPriority;

/// The largest record either side sends (a spawn request's program,
/// arguments, environment and paths).
pub const MAX_RECORD: usize = 512 * 1024;

/// A worker's credentials on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireCredentials {
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

/// What the spawner starts, and how: everything a worker needs between
/// fork and exec. Its descriptors travel with it: stdin, stdout, stderr,
/// the progress fd, then the Landlock ruleset if `landlock`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpawnRequest {
    /// The request's id, which every answer about it carries.
    pub id: u64,
    /// The executable's path.
    pub program: Vec<u8>,
    /// Its arguments (without argv\[0\], which is the program).
    pub args: Vec<Vec<u8>>,
    /// Its whole environment, `KEY=value` each.
    pub env: Vec<Vec<u8>>,
    /// Its working directory.
    pub cwd: Vec<u8>,
    /// The job's cgroup directories, killed should the supervisor die.
    pub cgroups: Vec<Vec<u8>>,
    /// The job's v2 cgroup directory, which the worker is cloned into (or
    /// joins through its `cgroup.procs`, where `clone3` is refused).
    pub unified: Option<Vec<u8>>,
    /// The v1 `tasks` files the worker writes itself into.
    pub tasks: Vec<Vec<u8>>,
    /// rlimits: resource and value.
    pub rlimits: Vec<(u32, u64)>,
    /// Its CPU and I/O priority.
    pub priority: WorkerPriority,
    /// The umask.
    pub umask: u32,
    /// Who it runs as, if not the spawner's own user.
    pub credentials: Option<WireCredentials>,
    /// Its uid is the job's own: its keyrings are emptied, and it gets a
    /// session keyring of its own.
    pub own_keyrings: bool,
    /// A network namespace of its own.
    pub no_network: bool,
    /// A /tmp of its own.
    pub private_tmp: bool,
    /// Whether a Landlock ruleset descriptor follows the four others.
    pub landlock: bool,
}

/// What the supervisor asks of the spawner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Start a worker.
    Spawn(Box<SpawnRequest>),
    /// The job's processes are gone (the supervisor killed its group and
    /// cgroup): forget it.
    Ended {
        /// The spawn request's id.
        id: u64,
    },
    /// Kill every process of a uid (a helper becomes it and kills all it
    /// may signal).
    KillUid {
        /// The request's id.
        id: u64,
        /// The uid (never 0).
        uid: u32,
    },
}

/// What the spawner answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The worker runs (it was exec'd).
    Started {
        /// The spawn request's id.
        id: u64,
        /// Its pid, also its process group and session.
        pid: i32,
    },
    /// The worker could not be started.
    NotStarted {
        /// The spawn request's id.
        id: u64,
        /// The errno of the step that failed.
        errno: i32,
    },
    /// The worker ended and was reaped.
    Exited {
        /// The spawn request's id.
        id: u64,
        /// Its wait status.
        status: i32,
    },
    /// A [`Request::KillUid`] is done.
    UidKilled {
        /// The request's id.
        id: u64,
        /// The helper's wait status, or a negative errno if it could not
        /// be forked.
        status: i32,
    },
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    fn list(&mut self, v: &[Vec<u8>]) {
        self.u32(v.len() as u32);
        for item in v {
            self.bytes(item);
        }
    }
}

struct Reader<'a>(&'a [u8]);

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "a spawner message is cut short")
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(short());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| short())?,
        ))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| short())?,
        ))
    }
    fn i32(&mut self) -> io::Result<i32> {
        Ok(self.u32()? as i32)
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn list(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let n = self.u32()? as usize;
        if n > self.0.len() {
            return Err(short());
        }
        (0..n).map(|_| self.bytes()).collect()
    }
    fn bool(&mut self) -> io::Result<bool> {
        Ok(self.u8()? != 0)
    }
}

impl Request {
    /// The record for this request.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(512));
        match self {
            Request::Spawn(s) => {
                w.u8(1);
                w.u64(s.id);
                w.bytes(&s.program);
                w.list(&s.args);
                w.list(&s.env);
                w.bytes(&s.cwd);
                w.list(&s.cgroups);
                match &s.unified {
                    None => w.u8(0),
                    Some(dir) => {
                        w.u8(1);
                        w.bytes(dir);
                    }
                }
                w.list(&s.tasks);
                w.u32(s.rlimits.len() as u32);
                for &(resource, value) in &s.rlimits {
                    w.u32(resource);
                    w.u64(value);
                }
                let (flags, nice) = s.priority.encode();
                w.u8(flags);
                w.u32(nice as u32);
                w.u32(s.umask);
                match &s.credentials {
                    None => w.u8(0),
                    Some(c) => {
                        w.u8(1);
                        w.u32(c.uid);
                        w.u32(c.gid);
                        w.u32(c.groups.len() as u32);
                        for &g in &c.groups {
                            w.u32(g);
                        }
                    }
                }
                w.u8(s.own_keyrings.into());
                w.u8(s.no_network.into());
                w.u8(s.private_tmp.into());
                w.u8(s.landlock.into());
            }
            Request::Ended { id } => {
                w.u8(2);
                w.u64(*id);
            }
            Request::KillUid { id, uid } => {
                w.u8(3);
                w.u64(*id);
                w.u32(*uid);
            }
        }
        w.0
    }

    /// Reads a request's record.
    pub fn decode(record: &[u8]) -> io::Result<Request> {
        let mut r = Reader(record);
        match r.u8()? {
            1 => {
                let id = r.u64()?;
                let program = r.bytes()?;
                let args = r.list()?;
                let env = r.list()?;
                let cwd = r.bytes()?;
                let cgroups = r.list()?;
                let unified = match r.u8()? {
                    0 => None,
                    _ => Some(r.bytes()?),
                };
                let tasks = r.list()?;
                let n = r.u32()? as usize;
                if n > 64 {
                    return Err(short());
                }
                let rlimits = (0..n)
                    .map(|_| Ok((r.u32()?, r.u64()?)))
                    .collect::<io::Result<_>>()?;
                let flags = r.u8()?;
                let nice = r.u32()? as i32;
                let priority = WorkerPriority::decode(flags, nice)?;
                let umask = r.u32()?;
                let credentials = match r.u8()? {
                    0 => None,
                    _ => {
                        let uid = r.u32()?;
                        let gid = r.u32()?;
                        let n = r.u32()? as usize;
                        if n > 65536 {
                            return Err(short());
                        }
                        let groups = (0..n).map(|_| r.u32()).collect::<io::Result<_>>()?;
                        Some(WireCredentials { uid, gid, groups })
                    }
                };
                Ok(Request::Spawn(Box::new(SpawnRequest {
                    id,
                    program,
                    args,
                    env,
                    cwd,
                    cgroups,
                    unified,
                    tasks,
                    rlimits,
                    priority,
                    umask,
                    credentials,
                    own_keyrings: r.bool()?,
                    no_network: r.bool()?,
                    private_tmp: r.bool()?,
                    landlock: r.bool()?,
                })))
            }
            2 => Ok(Request::Ended { id: r.u64()? }),
            3 => Ok(Request::KillUid {
                id: r.u64()?,
                uid: r.u32()?,
            }),
            kind => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown spawner request kind {kind}"),
            )),
        }
    }
}

impl Reply {
    /// The record for this reply.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(16));
        let (kind, id, value) = match *self {
            Reply::Started { id, pid } => (1, id, pid),
            Reply::NotStarted { id, errno } => (2, id, errno),
            Reply::Exited { id, status } => (3, id, status),
            Reply::UidKilled { id, status } => (4, id, status),
        };
        w.u8(kind);
        w.u64(id);
        w.u32(value as u32);
        w.0
    }

    /// Reads a reply's record.
    pub fn decode(record: &[u8]) -> io::Result<Reply> {
        let mut r = Reader(record);
        let kind = r.u8()?;
        let id = r.u64()?;
        let value = r.i32()?;
        Ok(match kind {
            1 => Reply::Started { id, pid: value },
            2 => Reply::NotStarted { id, errno: value },
            3 => Reply::Exited { id, status: value },
            4 => Reply::UidKilled { id, status: value },
            kind => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown spawner reply kind {kind}"),
                ));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spawn request with every field set: cgroups, credentials, flags.
    fn a_full_spawn_request() -> Request {
        Request::Spawn(Box::new(SpawnRequest {
            id: 7,
            program: b"/w/Noop".to_vec(),
            args: vec![b"a".to_vec(), Vec::new()],
            env: vec![b"PATH=/bin".to_vec()],
            cwd: b"/scratch/7".to_vec(),
            cgroups: vec![b"/sys/fs/cgroup/x".to_vec()],
            unified: Some(b"/sys/fs/cgroup/x".to_vec()),
            tasks: vec![b"/sys/fs/cgroup/pids/x/tasks".to_vec()],
            rlimits: vec![(7, 1024)],
            priority: WorkerPriority {
                sched_idle: true,
                nice: None,
                io_idle: true,
            },
            umask: 0o077,
            credentials: Some(WireCredentials {
                uid: 1000,
                gid: 1000,
                groups: vec![1, 2],
            }),
            own_keyrings: true,
            no_network: true,
            private_tmp: false,
            landlock: true,
        }))
    }

    #[test]
    fn requests_and_replies_read_back_as_written() {
        let spawn = a_full_spawn_request();
        let mut without_cgroups = spawn.clone();
        if let Request::Spawn(s) = &mut without_cgroups {
            s.unified = None;
            s.tasks.clear();
        }
        for request in [
            spawn,
            without_cgroups,
            Request::Ended { id: 9 },
            Request::KillUid { id: 3, uid: 70000 },
        ] {
            assert_eq!(Request::decode(&request.encode()).unwrap(), request);
        }
        for reply in [
            Reply::Started { id: 1, pid: 42 },
            Reply::NotStarted { id: 2, errno: 13 },
            Reply::Exited { id: 3, status: 256 },
            Reply::UidKilled { id: 4, status: -12 },
        ] {
            assert_eq!(Reply::decode(&reply.encode()).unwrap(), reply);
        }
    }

    #[test]
    fn cut_or_unknown_records_are_refused() {
        let record = Request::KillUid { id: 3, uid: 70000 }.encode();
        assert!(Request::decode(&record[..record.len() - 1]).is_err());
        assert!(Request::decode(&[9]).is_err());
        assert!(Request::decode(&[]).is_err());
        // A list length larger than what follows.
        assert!(
            Request::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255]).is_err()
        );
        assert!(Reply::decode(&[1, 2]).is_err());
    }

    #[test]
    fn a_spawn_record_cut_anywhere_is_refused() {
        let record = a_full_spawn_request().encode();
        for len in 0..record.len() {
            assert!(
                Request::decode(&record[..len]).is_err(),
                "a spawn record cut to {len} of {} bytes was read",
                record.len()
            );
        }
    }
}
