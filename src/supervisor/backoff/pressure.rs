//! The pressure signal the back-off follows, read from the kernel's
//! pressure-stall information (PSI), whose `avg10` moves within seconds:
//! either the highest of the site's own cgroups' CPU `full avg10` and
//! memory and I/O `some avg10`, or, without them, the system-wide `full
//! avg10` of memory and I/O, the share of time in which every task that
//! wanted to run, the site's included, was stalled. A pressure counts only
//! where others than the pressed can be its cause: the site's own CPU
//! `some` counts its tasks waiting behind each other (13 to 16 % for a
//! site at half its capacity on two cores, with no job running), its CPU
//! `full` only the time none of them ran because something else had the
//! CPUs; system-wide `some` would count jobs waiting behind each other, and
//! a storm of jobs would then freeze jobs because of themselves.

use std::path::{Component, Path, PathBuf};

use thiserror::Error;

/// Where the kernel's system-wide pressure files are.
pub const PROC_PRESSURE: &str = "/proc/pressure";

/// The resources whose pressure a site cgroup is read for.
/// The resources whose pressure a site cgroup is read for, and which line
/// of each (see the module's doc).
const SITE_RESOURCES: [(&str, Line); 3] = [
    ("cpu", Line::Full),
    ("memory", Line::Some),
    ("io", Line::Some),
];

/// The resources whose system-wide pressure is read.
const SYSTEM_RESOURCES: [&str; 2] = ["memory", "io"];

/// Which line of a PSI file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// `some`: at least one task was stalled.
    Some,
    /// `full`: every non-idle task was stalled at once.
    Full,
}

impl Line {
    fn prefix(self) -> &'static str {
        match self {
            Line::Some => "some ",
            Line::Full => "full ",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Line::Some => "some",
            Line::Full => "full",
        }
    }
}

/// What the back-off reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// The site's cgroups: the highest of their CPU `full avg10` and their
    /// memory and I/O `some avg10`. Each is the configured path and the
    /// directory it names.
    Site(Vec<(String, PathBuf)>),
    /// The system: the highest `full avg10` of the memory and I/O pressure
    /// files in this directory (`/proc/pressure`).
    System(PathBuf),
}

/// One reading of the signal.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The pressure, percent of the last 10 seconds.
    pub percent: f64,
    /// The file that gave it (the highest).
    pub from: PathBuf,
}

/// Why the signal could not be read or set up.
#[derive(Debug, Error, PartialEq)]
pub enum PressureError {
    /// A file is not in PSI format.
    #[error(
        "{path}: not a pressure file: no \"{line} avg10=\" reading in {text:?} (the kernel writes e.g. \"{line} avg10=1.50 avg60=0.80 avg300=0.20 total=12345\")"
    )]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Which line was looked for.
        line: &'static str,
        /// Its first bytes.
        text: String,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {message}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A site cgroup does not exist.
    #[error(
        "site-cgroup {given}: {dir} does not exist; give the site's cgroup v2 path, as the 0:: line of /proc/PID/cgroup of one of its processes shows it (e.g. /system.slice/php8.2-fpm.service)"
    )]
    NoSiteCgroup {
        /// The configured path.
        given: String,
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// A site cgroup path is not a plain path under the v2 mount.
    #[error("site-cgroup {0:?}: not a cgroup path; write it as /slice/unit, without \"..\"")]
    BadSiteCgroup(String),
    /// There is no cgroup v2 tree to find site cgroups in.
    #[error(
        "site-cgroup needs a cgroup v2 tree, and neither /sys/fs/cgroup nor /sys/fs/cgroup/unified is one"
    )]
    NoV2Tree,
}

/// The `avg10` of the `line` line of PSI text read from `path`.
pub fn parse(path: &Path, text: &str, line: Line) -> Result<f64, PressureError> {
    text.lines()
        .find_map(|l| l.strip_prefix(line.prefix()))
        .and_then(|rest| {
            rest.split_whitespace()
                .find_map(|f| f.strip_prefix("avg10="))
        })
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
        .ok_or_else(|| PressureError::Malformed {
            path: path.to_path_buf(),
            line: line.name(),
            text: text.chars().take(120).collect(),
        })
}

/// The `avg10` of one file; `None` when it does not exist, or when it is a
/// cgroup's `cpu.pressure` without the `full` line asked for (kernels
/// before 5.13 have none).
fn read_file(path: &Path, line: Line) -> Result<Option<f64>, PressureError> {
    let cgroup_cpu = path.file_name().is_some_and(|n| n == "cpu.pressure");
    match std::fs::read_to_string(path) {
        Ok(text)
            if cgroup_cpu
                && line == Line::Full
                && !text.lines().any(|l| l.starts_with("full ")) =>
        {
            Ok(None)
        }
        Ok(text) => parse(path, &text, line).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PressureError::Unreadable {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

/// The highest reading of `files`, skipping those that do not exist;
/// `None` when none does.
fn highest(files: impl Iterator<Item = (PathBuf, Line)>) -> Result<Option<Reading>, PressureError> {
    let mut best: Option<Reading> = None;
    for (path, line) in files {
        if let Some(percent) = read_file(&path, line)?
            && best.as_ref().is_none_or(|b| percent > b.percent)
        {
            best = Some(Reading {
                percent,
                from: path,
            });
        }
    }
    Ok(best)
}

impl Signal {
    /// Reads the signal now.
    pub fn read(&self) -> Result<Reading, PressureError> {
        match self {
            Signal::Site(cgroups) => {
                let mut best: Option<Reading> = None;
                for (given, dir) in cgroups {
                    let files = SITE_RESOURCES
                        .iter()
                        .map(|(r, line)| (dir.join(format!("{r}.pressure")), *line));
                    let reading = match highest(files)? {
                        Some(reading) => reading,
                        None if !dir.is_dir() => {
                            return Err(PressureError::NoSiteCgroup {
                                given: given.clone(),
                                dir: dir.clone(),
                            });
                        }
                        None => {
                            return Err(PressureError::Unreadable {
                                path: dir.join("cpu.pressure"),
                                message: "no pressure files in the site's cgroup".into(),
                            });
                        }
                    };
                    if best.as_ref().is_none_or(|b| reading.percent > b.percent) {
                        best = Some(reading);
                    }
                }
                best.ok_or_else(|| PressureError::BadSiteCgroup(String::new()))
            }
            Signal::System(dir) => {
                let files = SYSTEM_RESOURCES.iter().map(|r| (dir.join(r), Line::Full));
                highest(files)?.ok_or_else(|| PressureError::Unreadable {
                    path: dir.join("memory"),
                    message: "no such file".into(),
                })
            }
        }
    }

    /// What it reads, for the start-up line and `jobmgr status`.
    pub fn describe(&self) -> String {
        match self {
            Signal::Site(cgroups) => {
                let names: Vec<&str> = cgroups.iter().map(|(given, _)| given.as_str()).collect();
                format!(
                    "site cgroups {} (highest of cpu \"full avg10\", memory and io \"some avg10\")",
                    names.join(", ")
                )
            }
            Signal::System(dir) => format!(
                "system-wide {} and {} (\"full avg10\")",
                dir.join("memory").display(),
                dir.join("io").display()
            ),
        }
    }
}

/// The signal to follow, or why there is none: the site cgroups when
/// given (each must exist), else the system-wide files when the kernel has
/// them. `pressure_dir` stands for `/proc/pressure` and for the cgroup v2
/// mount alike (tests and containers). A signal is read once here, so
/// that a file in the wrong format is refused at start.
pub fn resolve(
    site: &[String],
    pressure_dir: Option<&Path>,
) -> Result<Result<Signal, String>, PressureError> {
    if !site.is_empty() {
        let mount = match pressure_dir {
            Some(dir) => dir.to_path_buf(),
            None => crate::supervisor::cgroup::unified_mount().ok_or(PressureError::NoV2Tree)?,
        };
        let mut cgroups = Vec::new();
        for given in site {
            let relative = Path::new(given.trim_start_matches('/'));
            let plain = relative
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
            if given.trim().is_empty() || !plain {
                return Err(PressureError::BadSiteCgroup(given.clone()));
            }
            let dir = mount.join(relative);
            if !dir.is_dir() {
                return Err(PressureError::NoSiteCgroup {
                    given: given.clone(),
                    dir,
                });
            }
            cgroups.push((given.clone(), dir));
        }
        let signal = Signal::Site(cgroups);
        return match signal.read() {
            Ok(_) => Ok(Ok(signal)),
            // A kernel without PSI: the cgroups have no pressure files.
            Err(PressureError::Unreadable { path, .. }) if !path.exists() => Ok(Err(format!(
                "the site's cgroups have no pressure files ({} does not exist: a kernel without PSI, or booted with psi=0)",
                path.display()
            ))),
            Err(e) => Err(e),
        };
    }
    let dir = pressure_dir.map_or_else(|| PathBuf::from(PROC_PRESSURE), Path::to_path_buf);
    if !SYSTEM_RESOURCES.iter().any(|r| dir.join(r).exists()) {
        return Ok(Err(format!(
            "{} does not exist (a kernel without PSI, or booted with psi=0)",
            dir.join("memory").display()
        )));
    }
    let signal = Signal::System(dir);
    signal.read()?;
    Ok(Ok(signal))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PSI: &str = "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=4.25 avg60=0.00 avg300=0.00 total=0\n";

    fn psi(some: f64, full: f64) -> String {
        format!(
            "some avg10={some:.2} avg60=0.00 avg300=0.00 total=1\nfull avg10={full:.2} avg60=0.00 avg300=0.00 total=1\n"
        )
    }

    #[test]
    fn the_some_and_full_lines_are_read() {
        let path = Path::new("/x");
        assert_eq!(parse(path, PSI, Line::Some), Ok(12.5));
        assert_eq!(parse(path, PSI, Line::Full), Ok(4.25));
        // The CPU file of older kernels has no full line.
        assert!(
            parse(
                path,
                "some avg10=1.00 avg60=0 avg300=0 total=0\n",
                Line::Full
            )
            .is_err()
        );
    }

    #[test]
    fn malformed_files_are_refused_naming_the_file_and_what_was_expected() {
        let path = Path::new("/p/memory");
        for bad in [
            "",
            "garbage",
            "some avg10=abc avg60=0\n",
            "some avg10=NaN\n",
            "some avg10=-1\n",
            "some avg10=101\n",
            "some avg60=1.00\n",
        ] {
            let error = parse(path, bad, Line::Some).unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains("/p/memory") && message.contains("some avg10="),
                "{bad:?}: {message}"
            );
        }
    }

    #[test]
    fn site_cgroups_give_their_cpu_full_or_memory_and_io_some_and_the_system_its_highest_full() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("system.slice/php.service");
        std::fs::create_dir_all(&site).unwrap();
        // The site's own CPU some (its tasks behind each other) does not
        // count; its CPU full does.
        std::fs::write(site.join("cpu.pressure"), psi(95.0, 3.0)).unwrap();
        std::fs::write(site.join("memory.pressure"), psi(7.5, 90.0)).unwrap();
        // No io.pressure: skipped.
        let signal = resolve(&["/system.slice/php.service".into()], Some(dir.path()))
            .unwrap()
            .unwrap();
        let reading = signal.read().unwrap();
        assert_eq!(reading.percent, 7.5);
        assert_eq!(reading.from, site.join("memory.pressure"));
        assert!(signal.describe().contains("/system.slice/php.service"));
        std::fs::write(site.join("cpu.pressure"), psi(95.0, 40.0)).unwrap();
        assert_eq!(signal.read().unwrap().percent, 40.0);
        // A kernel's cgroup CPU file without a full line: CPU gives none.
        std::fs::write(
            site.join("cpu.pressure"),
            "some avg10=95.00 avg60=0 avg300=0 total=0\n",
        )
        .unwrap();
        assert_eq!(signal.read().unwrap().percent, 7.5);

        std::fs::write(dir.path().join("memory"), psi(50.0, 2.0)).unwrap();
        std::fs::write(dir.path().join("io"), psi(60.0, 6.0)).unwrap();
        std::fs::write(dir.path().join("cpu"), psi(99.0, 99.0)).unwrap();
        let system = resolve(&[], Some(dir.path())).unwrap().unwrap();
        assert_eq!(
            system.read().unwrap().percent,
            6.0,
            "full of memory and io only"
        );
    }

    #[test]
    fn a_missing_site_cgroup_a_bad_path_and_no_psi_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let error = resolve(&["/system.slice/gone.service".into()], Some(dir.path())).unwrap_err();
        assert!(
            matches!(error, PressureError::NoSiteCgroup { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("/system.slice/gone.service"));
        let error = resolve(&["/a/../../etc".into()], Some(dir.path())).unwrap_err();
        assert!(matches!(error, PressureError::BadSiteCgroup(_)), "{error}");
        // No PSI files at all: off, with the reason.
        let off = resolve(&[], Some(dir.path())).unwrap().unwrap_err();
        assert!(off.contains("without PSI"), "{off}");
        std::fs::create_dir(dir.path().join("site")).unwrap();
        let off = resolve(&["site".into()], Some(dir.path()))
            .unwrap()
            .unwrap_err();
        assert!(off.contains("no pressure files"), "{off}");
        // A malformed system file is refused at start.
        std::fs::write(dir.path().join("memory"), "nonsense\n").unwrap();
        assert!(matches!(
            resolve(&[], Some(dir.path())),
            Err(PressureError::Malformed { .. })
        ));
    }
}
