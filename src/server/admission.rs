//! Which connections a port keeps, shared by the HTTP and Bedrock ports.
//!
//! A connection is *unproven* until one of its requests passes the token
//! check. Unproven connections are second-class: they have a pool of their
//! own (a quarter of the port's connections), they must prove themselves
//! within a short deadline of their accept, and when a place is needed the
//! oldest of them is evicted rather than the newcomer refused. So anyone
//! who can open sockets (a worker, or any address in 127.0.0.0/8) cannot
//! lock the port: a client with the token, which sends its request at once,
//! is always admitted and proves itself before a flood can evict it.
//! Proven connections are never evicted; they count against the port's cap
//! as before, and only they make a newcomer be refused.
//!
//! A connection proven by a job token (see
//! [`crate::server::bedrock::job_scope`]: a running job's worker, which is
//! not trusted) has places of its own instead: at most
//! [`Admission::max_per_job`] for each job, and half of the port's
//! connections for all jobs together, so the other half is always left to
//! clients with the API token. It is refused (and must close) when its
//! job's or the jobs' places are taken, and it does not count against its
//! peer bucket's cap: a worker cannot take the places of the supervisor and
//! the CLI on its address. A connection keeps the standing of the request
//! that first proved it.
//!
//! Connections are also counted per peer *bucket*: an IPv4 address (an
//! IPv4-mapped IPv6 address counts as its IPv4), or an IPv6 /64, which one
//! host usually holds whole. A bucket at its cap evicts its own oldest
//! unproven connection for a newcomer, so one peer's flood churns only its
//! own connections; it is refused only when all its connections are proven.
//! Loopback addresses are separate buckets like any other: with eviction,
//! merging them would buy nothing against a local flood and would make the
//! supervisor, the CLI and local clients share one cap.
//!
//! An evicted connection is *closing*: it leaves its bucket and the
//! unproven pool at once, but keeps counting against the port's cap until
//! it is gone, so that a port that answers an evicted connection's request
//! (with a refusal, rather than closing it without a word) still holds no
//! more than its cap. A newcomer that needs a place in a full port closes
//! the oldest closing connection at once ([`Ticket::must_close`]).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::protocol::JobId;

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its peer bucket holds its cap of proven connections.
    PeerFull,
    /// The port holds its cap of proven connections.
    Full,
}

/// What a request proved its connection with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// The API token (or a trusted peer): a client of the server.
    ApiToken,
    /// A job token of this job: the job's worker.
    JobToken(JobId),
}

/// Why a connection could not be proven; it must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unproven {
    /// It was evicted for a newcomer just before.
    Evicted,
    /// Its job holds [`Admission::max_per_job`] connections already.
    JobFull,
    /// Jobs hold their share of the port (half of it) already.
    JobsFull,
}

/// Why an unproven connection must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// A newcomer took its place.
    Evicted,
    /// It did not prove itself within the deadline.
    Late,
}

/// The connections a port holds, within its caps.
#[derive(Debug)]
pub struct Admission {
    max_connections: usize,
    max_unproven: usize,
    max_per_peer: usize,
    max_jobs: usize,
    max_per_job: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Connections held, proven or not.
    total: usize,
    per_bucket: HashMap<IpAddr, usize>,
    /// Unproven connections by age (admission order), oldest first.
    unproven: BTreeMap<u64, (IpAddr, Marks)>,
    /// Evicted connections still open, by age, oldest first: counted in
    /// `total`, no longer in their bucket.
    closing: BTreeMap<u64, Marks>,
    /// Connections proven by a job token, by ticket: their job.
    job_held: HashMap<u64, JobId>,
    per_job: HashMap<JobId, usize>,
    next_id: u64,
}

/// How admission tells a connection it lost its place.
#[derive(Debug, Clone, Default)]
struct Marks {
    /// It was evicted: it may not prove itself any more.
    evicted: CancellationToken,
    /// Its place in the port was taken too: it must close at once.
    closed: CancellationToken,
}

impl State {
    fn forget(&mut self, bucket: IpAddr) {
        self.total -= 1;
        self.leave_bucket(bucket);
    }

    fn leave_bucket(&mut self, bucket: IpAddr) {
        if let Some(count) = self.per_bucket.get_mut(&bucket) {
            *count -= 1;
            if *count == 0 {
                self.per_bucket.remove(&bucket);
            }
        }
    }

    /// Evicts an unproven connection: it leaves its bucket and the pool,
    /// and is closing (it still counts in `total`).
    fn evict(&mut self, id: u64) {
        if let Some((bucket, marks)) = self.unproven.remove(&id) {
            marks.evicted.cancel();
            if let Some(count) = self.per_bucket.get_mut(&bucket) {
                *count -= 1;
                if *count == 0 {
                    self.per_bucket.remove(&bucket);
                }
            }
            self.closing.insert(id, marks);
        }
    }

    /// Closes the oldest closing connection at once, freeing its place in
    /// the port; false if there is none.
    fn close_oldest(&mut self) -> bool {
        match self.closing.pop_first() {
            Some((_, marks)) => {
                marks.closed.cancel();
                self.total -= 1;
                true
            }
            None => false,
        }
    }

    /// Frees the place of a connection proven by a job token; false if it
    /// was not one.
    fn forget_job_held(&mut self, id: u64) -> bool {
        let Some(job) = self.job_held.remove(&id) else {
            return false;
        };
        self.total -= 1;
        if let Some(count) = self.per_job.get_mut(&job) {
            *count -= 1;
            if *count == 0 {
                self.per_job.remove(&job);
            }
        }
        true
    }
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    bucket: IpAddr,
    admitted: Instant,
    marks: Marks,
    proven: CancellationToken,
}

/// The bucket a peer address is counted in: IPv4 (also when IPv4-mapped)
/// by address, IPv6 by /64.
pub fn bucket(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
    }
}

impl Admission {
    /// A port's admission with at most `max_connections` connections, a
    /// quarter of them (at least one) unproven, and `max_per_peer` per peer
    /// bucket; it takes no job tokens.
    pub fn new(max_connections: usize, max_per_peer: usize) -> Arc<Self> {
        Self::with_job_tokens(max_connections, max_per_peer, 0)
    }

    /// As [`Admission::new`], for a port that takes job tokens: at most
    /// `max_per_job` connections of each job, and half of the port's (at
    /// least one) of all jobs.
    pub fn with_job_tokens(
        max_connections: usize,
        max_per_peer: usize,
        max_per_job: usize,
    ) -> Arc<Self> {
        let max_connections = max_connections.max(1);
        Arc::new(Admission {
            max_connections,
            max_unproven: (max_connections / 4).max(1),
            max_per_peer: max_per_peer.max(1),
            max_jobs: if max_per_job == 0 {
                0
            } else {
                (max_connections / 2).max(1)
            },
            max_per_job,
            state: Mutex::new(State::default()),
        })
    }

    /// The most unproven connections held at once.
    pub fn max_unproven(&self) -> usize {
        self.max_unproven
    }

    /// The most connections proven by job tokens held at once, of all jobs.
    pub fn max_jobs(&self) -> usize {
        self.max_jobs
    }

    /// The most connections proven by job tokens held at once, per job.
    pub fn max_per_job(&self) -> usize {
        self.max_per_job
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `ip` as unproven, evicting the oldest
    /// unproven connection of its bucket (if the bucket is at its cap) or
    /// of the port (if the unproven pool is full), and closing the oldest
    /// closing connection if the port is full. Refused only when the place
    /// it needs is held by proven connections.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, Refusal> {
        let bucket = bucket(ip);
        let mut state = self.lock();
        let in_bucket = state.per_bucket.get(&bucket).copied().unwrap_or(0);
        if in_bucket >= self.max_per_peer {
            let own = state
                .unproven
                .iter()
                .find(|(_, (b, _))| *b == bucket)
                .map(|(id, _)| *id);
            match own {
                Some(id) => state.evict(id),
                None => return Err(Refusal::PeerFull),
            }
        }
        if state.unproven.len() >= self.max_unproven {
            if let Some(id) = state.unproven.keys().next().copied() {
                state.evict(id);
            }
        }
        if state.total >= self.max_connections && !state.close_oldest() {
            match state.unproven.keys().next().copied() {
                Some(id) => {
                    state.evict(id);
                    state.close_oldest();
                }
                None => return Err(Refusal::Full),
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        state.total += 1;
        *state.per_bucket.entry(bucket).or_insert(0) += 1;
        let marks = Marks::default();
        state.unproven.insert(id, (bucket, marks.clone()));
        Ok(Ticket {
            admission: Arc::clone(self),
            id,
            bucket,
            admitted: Instant::now(),
            marks,
            proven: CancellationToken::new(),
        })
    }

    /// Connections held: (all, unproven).
    pub fn held(&self) -> (usize, usize) {
        let state = self.lock();
        (state.total, state.unproven.len())
    }

    /// Connections held that a job token proved.
    pub fn held_by_jobs(&self) -> usize {
        self.lock().job_held.len()
    }
}

impl Ticket {
    /// Marks the connection proven by the API token (a request on it
    /// passed the token check): it is no longer evicted nor held to the
    /// deadline. False if it was evicted already; it must then close.
    pub fn prove(&self) -> bool {
        self.prove_with(Credential::ApiToken).is_ok()
    }

    /// Marks the connection proven by `credential`, within a job token's
    /// places (see the module's doc). Once proven, it keeps its standing
    /// whatever later requests carry. An error means it must close.
    pub fn prove_with(&self, credential: Credential) -> Result<(), Unproven> {
        let admission = &self.admission;
        let mut state = admission.lock();
        if self.marks.evicted.is_cancelled() {
            return Err(Unproven::Evicted);
        }
        if self.is_proven() {
            return Ok(());
        }
        if let Credential::JobToken(job) = credential {
            let of_job = state.per_job.get(&job).copied().unwrap_or(0);
            if of_job >= admission.max_per_job {
                return Err(Unproven::JobFull);
            }
            if state.job_held.len() >= admission.max_jobs {
                return Err(Unproven::JobsFull);
            }
            *state.per_job.entry(job).or_insert(0) += 1;
            state.job_held.insert(self.id, job);
            state.leave_bucket(self.bucket);
        }
        state.unproven.remove(&self.id);
        self.proven.cancel();
        Ok(())
    }

    /// Whether the connection has proven itself.
    pub fn is_proven(&self) -> bool {
        self.proven.is_cancelled()
    }

    /// Whether the connection was evicted: it cannot prove itself, and
    /// should answer what it is asked with a refusal, then close.
    pub fn is_evicted(&self) -> bool {
        self.marks.evicted.is_cancelled()
    }

    /// Resolves when the connection must close, unproven: evicted, or
    /// `deadline` after its accept. Never resolves once it is proven.
    pub async fn lapsed(&self, deadline: Duration) -> Lapse {
        tokio::select! {
            biased;
            _ = self.proven.cancelled() => std::future::pending().await,
            _ = self.marks.evicted.cancelled() => Lapse::Evicted,
            _ = tokio::time::sleep_until(self.admitted + deadline) => {
                if self.is_proven() {
                    std::future::pending().await
                } else {
                    Lapse::Late
                }
            }
        }
    }

    /// As [`Ticket::lapsed`], for a connection that stays open once evicted
    /// to answer its request with a refusal ([`Ticket::is_evicted`]):
    /// resolves when its place in the port is taken too (`Evicted`), or
    /// `deadline` after its accept if it is unproven (`Late`).
    pub async fn must_close(&self, deadline: Duration) -> Lapse {
        tokio::select! {
            biased;
            _ = self.proven.cancelled() => std::future::pending().await,
            _ = self.marks.closed.cancelled() => Lapse::Evicted,
            _ = tokio::time::sleep_until(self.admitted + deadline) => {
                if self.is_proven() {
                    std::future::pending().await
                } else {
                    Lapse::Late
                }
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        // A closed connection's place was freed when it was closed; an
        // evicted one left its bucket when it was evicted.
        if self.marks.closed.is_cancelled() {
            return;
        }
        if self.marks.evicted.is_cancelled() {
            state.closing.remove(&self.id);
            state.total -= 1;
            return;
        }
        state.unproven.remove(&self.id);
        if !state.forget_job_held(self.id) {
            state.forget(self.bucket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn buckets_are_ipv4_addresses_and_ipv6_64s() {
        assert_eq!(bucket(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(bucket(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            bucket(ip("2001:db8:1:2:ffff::9")),
            bucket(ip("2001:db8:1:2::1"))
        );
        assert_ne!(bucket(ip("2001:db8:1:3::1")), bucket(ip("2001:db8:1:2::1")));
        assert_ne!(bucket(ip("127.0.0.2")), bucket(ip("127.0.0.1")));
    }

    #[tokio::test]
    async fn a_full_unproven_pool_evicts_its_oldest_for_a_newcomer() {
        let admission = Admission::new(8, 100);
        assert_eq!(admission.max_unproven(), 2);
        let first = admission.admit(ip("127.0.0.2")).unwrap();
        let second = admission.admit(ip("127.0.0.3")).unwrap();
        let third = admission.admit(ip("127.0.0.4")).unwrap();
        assert_eq!(first.lapsed(Duration::from_secs(60)).await, Lapse::Evicted);
        assert!(!first.prove(), "an evicted connection cannot prove itself");
        assert!(!second.marks.evicted.is_cancelled());
        assert_eq!(
            admission.held(),
            (3, 2),
            "an evicted connection counts against the port until it is gone"
        );
        drop(first);
        assert_eq!(admission.held(), (2, 2));
        assert!(third.prove());
        drop(second);
        assert_eq!(admission.held(), (1, 0));
    }

    #[test]
    fn proven_connections_are_never_evicted_and_only_they_refuse() {
        let admission = Admission::new(4, 100);
        let proven: Vec<Ticket> = (0..4)
            .map(|i| {
                let t = admission.admit(ip(&format!("127.0.0.{}", i + 2))).unwrap();
                assert!(t.prove());
                t
            })
            .collect();
        assert_eq!(admission.admit(ip("127.0.0.9")).unwrap_err(), Refusal::Full);
        assert!(proven.iter().all(|t| !t.marks.evicted.is_cancelled()));
        drop(proven);
        assert_eq!(admission.held(), (0, 0));
    }

    #[test]
    fn a_bucket_at_its_cap_evicts_its_own_oldest_unproven_only() {
        let admission = Admission::new(100, 2);
        let other = admission.admit(ip("10.0.0.9")).unwrap();
        let a = admission.admit(ip("10.0.0.1")).unwrap();
        let b = admission.admit(ip("10.0.0.1")).unwrap();
        let c = admission.admit(ip("::ffff:10.0.0.1")).unwrap();
        assert!(a.marks.evicted.is_cancelled(), "its own oldest");
        assert!(
            !other.marks.evicted.is_cancelled(),
            "another peer's is kept"
        );
        assert!(b.prove() && c.prove());
        assert_eq!(
            admission.admit(ip("10.0.0.1")).unwrap_err(),
            Refusal::PeerFull
        );
        assert!(admission.admit(ip("10.0.0.2")).is_ok());
    }

    #[test]
    fn job_tokens_have_places_per_job_and_half_the_port_and_never_take_the_rest() {
        let admission = Admission::with_job_tokens(8, 100, 2);
        assert_eq!((admission.max_jobs(), admission.max_per_job()), (4, 2));
        let job = |t: &Ticket, id| t.prove_with(Credential::JobToken(id));
        let mut held = Vec::new();
        for id in [1, 1, 2, 2] {
            let t = admission.admit(ip("127.0.0.2")).unwrap();
            assert_eq!(job(&t, id), Ok(()));
            held.push(t);
        }
        let third = admission.admit(ip("127.0.0.3")).unwrap();
        assert_eq!(job(&third, 1), Err(Unproven::JobFull), "its job's places");
        assert_eq!(job(&third, 3), Err(Unproven::JobsFull), "the jobs' share");
        drop(third);
        // The other half is the API token's, whatever the jobs try.
        let clients: Vec<Ticket> = (0..4)
            .map(|_| {
                let t = admission.admit(ip("127.0.0.1")).unwrap();
                assert!(t.prove());
                t
            })
            .collect();
        assert_eq!(admission.admit(ip("127.0.0.1")).unwrap_err(), Refusal::Full);
        assert_eq!(admission.held_by_jobs(), 4);
        // A closed one frees its job's place.
        held.remove(0);
        let again = admission.admit(ip("127.0.0.2")).unwrap();
        assert_eq!(job(&again, 1), Ok(()));
        // Proven once, a connection keeps its standing.
        assert_eq!(again.prove_with(Credential::ApiToken), Ok(()));
        assert_eq!(clients[0].prove_with(Credential::JobToken(9)), Ok(()));
        drop((held, again, clients));
        assert_eq!(admission.held(), (0, 0));
        assert_eq!(admission.held_by_jobs(), 0);
    }

    #[test]
    fn a_job_tokens_connections_leave_their_address_to_the_api_token() {
        let admission = Admission::with_job_tokens(100, 2, 10);
        let jobs: Vec<Ticket> = (0..6)
            .map(|_| {
                let t = admission.admit(ip("127.0.0.1")).unwrap();
                assert_eq!(t.prove_with(Credential::JobToken(7)), Ok(()));
                t
            })
            .collect();
        let a = admission.admit(ip("127.0.0.1")).unwrap();
        let b = admission.admit(ip("127.0.0.1")).unwrap();
        assert!(a.prove() && b.prove());
        assert_eq!(
            admission.admit(ip("127.0.0.1")).unwrap_err(),
            Refusal::PeerFull
        );
        drop(jobs);
        assert_eq!(admission.held(), (2, 0));
    }

    #[test]
    fn a_port_without_job_tokens_proves_none() {
        let admission = Admission::new(8, 8);
        let t = admission.admit(ip("127.0.0.1")).unwrap();
        assert_eq!(
            t.prove_with(Credential::JobToken(1)),
            Err(Unproven::JobFull)
        );
        assert!(t.prove());
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_connection_stays_to_answer_until_the_port_needs_its_place() {
        let admission = Admission::new(4, 1);
        let first = admission.admit(ip("10.0.0.1")).unwrap();
        let second = admission.admit(ip("10.0.0.1")).unwrap();
        assert!(first.is_evicted() && !second.is_evicted());
        assert!(!first.prove(), "an evicted connection cannot prove itself");
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            first.must_close(Duration::from_secs(60)),
        )
        .await;
        assert!(waited.is_err(), "it stays open while the port has room");
        assert_eq!(admission.held(), (2, 1));
        // Three proven connections fill the port with the closing one: the
        // next newcomer closes it, then is refused.
        let proven: Vec<Ticket> = (2..5)
            .map(|n| {
                let t = admission.admit(ip(&format!("10.0.0.{n}"))).unwrap();
                assert!(t.prove());
                t
            })
            .collect();
        assert_eq!(
            first.must_close(Duration::from_secs(60)).await,
            Lapse::Evicted
        );
        assert_eq!(admission.held(), (4, 0));
        drop(first);
        assert_eq!(
            admission.held(),
            (4, 0),
            "a closed place is not freed twice"
        );
        // The second was evicted from the unproven pool for the first
        // proven newcomer; the next newcomer closes it in turn.
        assert!(second.is_evicted());
        let last = admission.admit(ip("10.0.0.9")).unwrap();
        assert_eq!(
            second.must_close(Duration::from_secs(60)).await,
            Lapse::Evicted
        );
        assert!(last.prove());
        assert_eq!(admission.admit(ip("10.0.0.10")).unwrap_err(), Refusal::Full);
        drop((proven, second, last));
        assert_eq!(admission.held(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unproven_connection_lapses_at_its_deadline_a_proven_one_never() {
        let admission = Admission::new(8, 8);
        let late = admission.admit(ip("127.0.0.1")).unwrap();
        assert_eq!(late.lapsed(Duration::from_secs(10)).await, Lapse::Late);
        let proven = admission.admit(ip("127.0.0.1")).unwrap();
        assert!(proven.prove());
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            proven.lapsed(Duration::from_secs(10)),
        )
        .await;
        assert!(waited.is_err(), "a proven connection has no deadline");
    }
}
