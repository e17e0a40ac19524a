//! Connections counted per peer address, so that one client (or one host
//! behind one address) holding many idle connections cannot take every
//! connection the port serves and lock the others out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The open connections of each peer address, with a cap per address.
#[derive(Debug)]
pub struct PeerCounts {
    cap: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One counted connection; dropping it frees its place.
#[derive(Debug)]
pub struct PeerSlot {
    counts: Arc<PeerCounts>,
    ip: IpAddr,
}

impl PeerCounts {
    /// Counts with at most `cap` connections per address (at least one).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(PeerCounts {
            cap: cap.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection from `ip`, or `None` if it already
    /// has its cap.
    pub fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            counts: Arc::clone(self),
            ip,
        })
    }

    /// How many connections `ip` has open.
    pub fn open(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_own_cap_and_places_come_back() {
        let counts = PeerCounts::new(2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = counts.enter(a).unwrap();
        let _second = counts.enter(a).unwrap();
        assert!(counts.enter(a).is_none(), "a third from one address");
        assert!(counts.enter(b).is_some(), "another address is not affected");
        drop(first);
        assert_eq!(counts.open(a), 1);
        assert!(counts.enter(a).is_some(), "a freed place is used again");
    }

    #[test]
    fn an_address_with_nothing_open_is_forgotten() {
        let counts = PeerCounts::new(1);
        let a: IpAddr = "::1".parse().unwrap();
        drop(counts.enter(a).unwrap());
        assert!(counts.open.lock().unwrap().is_empty());
    }
}
