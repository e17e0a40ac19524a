//! One process's line in `/proc/<pid>/stat`, read for the two fields the
//! supervisor and its spawner need: whether it has ended, and its parent.

/// The state and parent of one process, from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The kernel's one-letter state (`R`, `S`, `Z`, …).
    pub state: char,
    /// The parent's pid.
    pub ppid: i32,
}

impl ProcStat {
    /// Reads `/proc/<pid>/stat`; `None` when the process is gone or the
    /// line does not read.
    pub fn read(pid: i32) -> Option<ProcStat> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// The line is "pid (comm) state ppid …", and `comm` may hold spaces and
    /// parentheses, so the fields are counted from the last `") "`.
    fn parse(line: &str) -> Option<ProcStat> {
        let (_, rest) = line.rsplit_once(") ")?;
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        Some(ProcStat { state, ppid })
    }

    /// Whether the process has ended and waits to be reaped (zombie, dead).
    pub fn ended(self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let stat = ProcStat::parse("42 (a) b) (c) S 7 42 42 0 -1").unwrap();
        assert_eq!(
            stat,
            ProcStat {
                state: 'S',
                ppid: 7
            }
        );
        assert!(!stat.ended());
        assert!(ProcStat::parse("43 (w) Z 1 0").unwrap().ended());
    }

    #[test]
    fn a_cut_or_garbled_line_reads_as_nothing() {
        for line in ["", "42 (a)", "42 (a) S", "42 (a) S x", "42 (a)S 7"] {
            assert_eq!(ProcStat::parse(line), None, "{line:?}");
        }
    }

    #[test]
    fn this_process_reads_with_its_parent() {
        let me = ProcStat::read(std::process::id() as i32).unwrap();
        assert_eq!(me.ppid, std::os::unix::process::parent_id() as i32);
        assert!(!me.ended());
    }
}
