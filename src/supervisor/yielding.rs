//! How jobs yield to the site they run beside: the settings, the
//! scheduling each worker gets before its exec (`SCHED_IDLE` or a nice
//! level, and the idle I/O class), and the files the jobs' parent cgroup
//! gets (`cpu.idle`, a low `io.weight`, `memory.high`).
//!
//! The parent cgroup is what makes a page render preempt a job: CPU time is
//! shared between cgroups (and autogroups) first, so a job's own
//! `SCHED_IDLE` only yields to tasks of its own group. A cgroup with
//! `cpu.idle = 1` yields to every sibling group, the site's included. The
//! per-task settings are what is left where there is no cgroup of ours.
//!
//! A worker cannot undo them: it runs with `RLIMIT_NICE` 0, under which the
//! kernel refuses an unprivileged task's leaving `SCHED_IDLE` or lowering
//! its nice level; and it cannot leave its cgroup. It can raise its own I/O
//! class from idle to best-effort (the kernel lets any task do that), which
//! the cgroup's `io.weight` still bounds where the host has it.

use std::io;

/// How much memory the jobs together may use before the kernel throttles
/// and reclaims them (`memory.high` of their parent cgroup).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryHigh {
    /// No such limit from the supervisor.
    Off,
    /// A share of the machine's memory, in percent.
    Share(f64),
    /// A number of bytes.
    Bytes(u64),
}

/// The default [`MemoryHigh`]: half of the machine.
pub const DEFAULT_MEMORY_HIGH: MemoryHigh = MemoryHigh::Share(50.0);

impl MemoryHigh {
    /// Reads `off`, a percentage (`60%`) or a size (`8G`, `512M`, bytes).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("off") {
            return Ok(MemoryHigh::Off);
        }
        if let Some(pct) = text.strip_suffix('%') {
            return match pct.trim().parse::<f64>() {
                Ok(p) if p.is_finite() && p > 0.0 && p <= 100.0 => Ok(MemoryHigh::Share(p)),
                _ => Err(format!(
                    "jobs-memory-high {text:?}: a share must be a percentage above 0 and at most 100, like 50%"
                )),
            };
        }
        match text.parse::<crate::config::ByteSize>() {
            Ok(size) if size.0 > 0 => Ok(MemoryHigh::Bytes(size.0)),
            _ => Err(format!(
                "jobs-memory-high {text:?}: expected a share of the machine's memory (50%), a size (8G, 512M) or off"
            )),
        }
    }

    /// The limit in bytes on a machine with `total` bytes of memory.
    pub fn bytes(&self, total: u64) -> Option<u64> {
        match *self {
            MemoryHigh::Off => None,
            MemoryHigh::Share(pct) => Some(((total as f64) * pct / 100.0) as u64),
            MemoryHigh::Bytes(n) => Some(n),
        }
    }
}

impl std::fmt::Display for MemoryHigh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryHigh::Off => f.write_str("off"),
            MemoryHigh::Share(pct) => write!(f, "{pct}%"),
            MemoryHigh::Bytes(n) => write!(f, "{}", crate::config::ByteSize(*n)),
        }
    }
}

/// What the operator asked of the jobs' yielding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YieldSettings {
    /// The jobs' cgroup is of idle priority, and workers run under
    /// `SCHED_IDLE` (or at [`YieldSettings::nice`]).
    pub cpu: bool,
    /// A nice level in place of `SCHED_IDLE`.
    pub nice: Option<i32>,
    /// Workers get the idle I/O class, the jobs' cgroup a low `io.weight`.
    pub io: bool,
    /// The jobs' cgroup's `memory.high`; `None`: the default, which is off
    /// where a service manager already set one above the supervisor.
    pub memory_high: Option<MemoryHigh>,
}

impl Default for YieldSettings {
    fn default() -> Self {
        YieldSettings {
            cpu: true,
            nice: None,
            io: true,
            memory_high: None,
        }
    }
}

impl YieldSettings {
    /// What each worker gets.
    pub fn worker(&self) -> WorkerPriority {
        WorkerPriority {
            sched_idle: self.cpu && self.nice.is_none(),
            nice: self.nice.filter(|_| self.cpu),
            io_idle: self.io,
        }
    }

    /// Checks a nice level.
    pub fn check_nice(nice: i32) -> Result<i32, String> {
        if (1..=19).contains(&nice) {
            Ok(nice)
        } else {
            Err(format!(
                "job-nice must be from 1 to 19 (19 yields most), not {nice}; leave it unset for SCHED_IDLE, which yields more"
            ))
        }
    }
}

/// What the jobs' parent cgroup gets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ParentYield {
    /// `cpu.idle` 1, else the least weight.
    pub cpu: bool,
    /// The least `io.weight`.
    pub io: bool,
    /// `memory.high` in bytes, and whether the operator set it (a default
    /// gives way to a limit the service manager set above).
    pub memory_high: Option<(u64, bool)>,
}

impl YieldSettings {
    /// What the jobs' parent cgroup gets on a machine with `total` bytes of
    /// memory.
    pub fn parent(&self, total: u64) -> ParentYield {
        let memory_high = match self.memory_high {
            Some(high) => high.bytes(total).map(|b| (b, true)),
            None => DEFAULT_MEMORY_HIGH.bytes(total).map(|b| (b, false)),
        };
        ParentYield {
            cpu: self.cpu,
            io: self.io,
            memory_high,
        }
    }
}

/// The machine's memory (`MemTotal`), in bytes; 0 if unknown.
pub fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib.saturating_mul(1024))
}

/// The `io.weight` of the jobs' parent cgroup (of 1 to 10000, 100 the
/// default of every other cgroup).
pub const JOBS_IO_WEIGHT: u32 = 1;
/// The `cpu.weight` of the jobs' parent cgroup where the kernel has no
/// `cpu.idle` (of 1 to 10000).
pub const JOBS_CPU_WEIGHT: u32 = 1;
/// The v1 `cpu.shares` likewise (2 is the kernel's least).
pub const JOBS_CPU_SHARES: u32 = 2;

/// What a worker gets between its clone and its exec.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerPriority {
    /// `SCHED_IDLE`.
    pub sched_idle: bool,
    /// A nice level (with `SCHED_OTHER`).
    pub nice: Option<i32>,
    /// The idle I/O class.
    pub io_idle: bool,
}

/// `ioprio_set`'s "a process", and the idle class shifted into place.
const IOPRIO_WHO_PROCESS: i64 = 1;
const IOPRIO_CLASS_IDLE: i64 = 3;
const IOPRIO_CLASS_SHIFT: i64 = 13;

impl WorkerPriority {
    /// Whether it changes anything.
    pub fn any(&self) -> bool {
        self.sched_idle || self.nice.is_some() || self.io_idle
    }

    /// Its wire form: flags, then the nice level.
    pub fn encode(&self) -> (u8, i32) {
        let flags = u8::from(self.sched_idle)
            | (u8::from(self.nice.is_some()) << 1)
            | (u8::from(self.io_idle) << 2);
        (flags, self.nice.unwrap_or(0))
    }

    /// Reads its wire form; unknown flags are refused.
    pub fn decode(flags: u8, nice: i32) -> io::Result<Self> {
        if flags & !0b111 != 0 || !(-20..=19).contains(&nice) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a worker priority the spawner does not know",
            ));
        }
        Ok(WorkerPriority {
            sched_idle: flags & 1 != 0,
            nice: (flags & 2 != 0).then_some(nice),
            io_idle: flags & 4 != 0,
        })
    }

    /// Applies it to the calling process, in the child before its exec (and
    /// before its rlimits, which take `RLIMIT_NICE` to 0).
    ///
    /// # Safety
    /// Only async-signal-safe system calls; call it in a freshly cloned or
    /// forked child.
    pub unsafe fn apply(&self) -> io::Result<()> {
        use nix::libc;
        let check = |r: libc::c_long| {
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY: plain system calls on the calling process.
        unsafe {
            if self.sched_idle {
                let param = libc::sched_param { sched_priority: 0 };
                check(libc::sched_setscheduler(0, libc::SCHED_IDLE, &param).into())?;
            }
            if let Some(nice) = self.nice {
                check(libc::setpriority(libc::PRIO_PROCESS, 0, nice).into())?;
            }
            if self.io_idle {
                let value = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
                check(libc::syscall(
                    libc::SYS_ioprio_set,
                    IOPRIO_WHO_PROCESS,
                    0,
                    value,
                ))?;
            }
        }
        Ok(())
    }

    /// What it is, for the start-up log.
    pub fn describe(&self) -> String {
        let cpu = match (self.sched_idle, self.nice) {
            (true, _) => "SCHED_IDLE".to_string(),
            (false, Some(n)) => format!("nice {n}"),
            _ => "normal CPU priority".to_string(),
        };
        let io = if self.io_idle {
            "idle I/O class"
        } else {
            "normal I/O class"
        };
        format!("{cpu}, {io}")
    }
}

/// The I/O class and level of process `pid` (`ioprio_get`): class 3 is
/// idle, 0 none set (best effort by its nice level).
pub fn io_class(pid: i32) -> io::Result<(i64, i64)> {
    // SAFETY: a query of another process's I/O priority.
    let value = unsafe { nix::libc::syscall(nix::libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, pid) };
    if value < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((
        value >> IOPRIO_CLASS_SHIFT,
        value & ((1 << IOPRIO_CLASS_SHIFT) - 1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_high_reads_shares_sizes_and_off_and_refuses_the_rest() {
        assert_eq!(MemoryHigh::parse("off").unwrap(), MemoryHigh::Off);
        assert_eq!(MemoryHigh::parse("60%").unwrap(), MemoryHigh::Share(60.0));
        assert_eq!(MemoryHigh::parse("2G").unwrap(), MemoryHigh::Bytes(2 << 30));
        assert_eq!(MemoryHigh::Share(25.0).bytes(1000), Some(250));
        assert_eq!(MemoryHigh::Off.bytes(1000), None);
        for bad in ["0%", "101%", "-5%", "NaN%", "lots", "0", ""] {
            let error = MemoryHigh::parse(bad).unwrap_err();
            assert!(error.contains("jobs-memory-high"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_priority_reads_back_as_written_and_unknown_flags_are_refused() {
        for priority in [
            WorkerPriority::default(),
            YieldSettings::default().worker(),
            WorkerPriority {
                sched_idle: false,
                nice: Some(19),
                io_idle: true,
            },
        ] {
            let (flags, nice) = priority.encode();
            assert_eq!(WorkerPriority::decode(flags, nice).unwrap(), priority);
        }
        assert!(WorkerPriority::decode(8, 0).is_err());
        assert!(WorkerPriority::decode(2, 40).is_err());
    }

    #[test]
    fn the_cpu_switch_turns_off_both_sched_idle_and_nice() {
        let off = YieldSettings {
            cpu: false,
            nice: Some(10),
            ..YieldSettings::default()
        };
        assert!(!off.worker().sched_idle);
        assert_eq!(off.worker().nice, None);
        let nice = YieldSettings {
            nice: Some(10),
            ..YieldSettings::default()
        };
        assert_eq!(nice.worker().nice, Some(10));
        assert!(!nice.worker().sched_idle);
        assert!(YieldSettings::check_nice(0).is_err());
        assert!(YieldSettings::check_nice(20).is_err());
    }
}
