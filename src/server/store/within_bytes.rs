//! Reading jobs within a byte bound: a listing page or a claim's candidates
//! stop before the row that would take them past it, so that many big jobs
//! are never read at once, but always hold one, so that a job bigger than
//! the bound is never stuck behind it.

/// How much one read of jobs may take: up to `jobs` rows within `bytes`
/// (see [`ByteCount`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Take {
    /// At most this many jobs.
    pub jobs: usize,
    /// Within this many bytes of names and data as stored; 0 bounds
    /// nothing.
    pub bytes: usize,
}

/// The bytes of the rows taken so far, against a bound.
#[derive(Debug, Clone, Copy)]
pub struct ByteCount {
    max: usize,
    used: usize,
}

impl ByteCount {
    /// A count against `max` bytes; 0 bounds nothing.
    pub fn new(max: usize) -> Self {
        ByteCount { max, used: 0 }
    }

    /// Whether a row of `size` bytes is taken: it fits, or it is the
    /// `first`. A row taken is counted.
    pub fn admit(&mut self, size: usize, first: bool) -> bool {
        let total = self.used.saturating_add(size);
        if self.max > 0 && total > self.max && !first {
            return false;
        }
        self.used = total;
        true
    }

    /// Whether no more rows fit (a first one always would).
    pub fn full(&self) -> bool {
        self.max > 0 && self.used >= self.max
    }

    /// The bytes left before the bound (`usize::MAX` with none).
    pub fn left(&self) -> usize {
        if self.max == 0 {
            usize::MAX
        } else {
            self.max.saturating_sub(self.used)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ByteCount;

    #[test]
    fn rows_are_taken_up_to_the_bound_and_a_first_one_always() {
        let mut count = ByteCount::new(10);
        assert!(count.admit(25, true), "a first row bigger than the bound");
        assert!(!count.admit(1, false));
        assert!(count.full());

        let mut count = ByteCount::new(10);
        assert!(count.admit(4, true));
        assert!(count.admit(6, false), "a row that just fits");
        assert!(!count.admit(1, false));
        assert_eq!(count.left(), 0);

        let mut unbounded = ByteCount::new(0);
        assert!(unbounded.admit(usize::MAX, false));
        assert!(!unbounded.full());
        assert_eq!(unbounded.left(), usize::MAX);
    }
}
