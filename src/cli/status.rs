//! `jobmgr status`: what a running supervisor is doing now (each pool's
//! gate, and each job it runs with its worker's pid and elapsed time), read
//! from the status file the supervisor keeps.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::CliError;
use crate::config::{self, HumanDuration, SupervisorOptions};
use crate::protocol::Timestamp;
use crate::supervisor::status::{self, BackoffStatus, Status};

/// Options of `jobmgr status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The supervisor's configuration file, to find its status file the way it does.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Print the status as JSON.
    #[arg(long)]
    pub json: bool,
    /// The supervisor's status file [default: as the supervisor's: status.json beside its spool directory]
    #[arg(long, value_name = "PATH", env = "JOBMGR_STATUS_FILE")]
    pub status_file: Option<PathBuf>,
    /// The supervisor's spool directory, to find the status file beside it.
    #[arg(long, value_name = "DIR", env = "JOBMGR_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// The supervisor's embedded store, to find its default state directory.
    #[arg(long, value_name = "PATH", env = "JOBMGR_DB")]
    pub db: Option<PathBuf>,
}

impl StatusArgs {
    /// The options that locate the status file, as the supervisor's.
    fn options(&self) -> SupervisorOptions {
        SupervisorOptions {
            status_file: self.status_file.clone(),
            spool_dir: self.spool_dir.clone(),
            db: self.db.clone(),
            ..SupervisorOptions::default()
        }
    }
}

/// Prints the status. Exit 3 when no supervisor is running there.
pub fn run(args: StatusArgs) -> Result<(), CliError> {
    let layers =
        config::load_layers(args.config.as_deref()).map_err(|e| CliError::Usage(e.to_string()))?;
    let options = args.options().over(config::merge_layers(&layers));
    let db = options
        .db
        .clone()
        .unwrap_or_else(crate::server::default_db_path);
    let state_dir = crate::server::StoreLocation::of(&db).state_dir();
    let path = config::status_file(&options, &state_dir);
    let status = status::read(&path).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => CliError::NotFound(format!(
            "no supervisor status at {}: is jobmgr running? (give `jobmgr status` the supervisor's --config or --status-file)",
            path.display()
        )),
        std::io::ErrorKind::PermissionDenied => CliError::Usage(format!(
            "cannot read the status file {}: {error}; it is the supervisor's user's and group's only (mode 640): run jobmgr status as that user or a member of that group",
            path.display()
        )),
        _ => CliError::Usage(format!("cannot read the status file {}: {error}", path.display())),
    })?;
    if !alive(status.pid) {
        return Err(CliError::NotFound(format!(
            "the supervisor that wrote {} (pid {}) is not running",
            path.display(),
            status.pid
        )));
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    } else {
        print!("{}", render(&status, Timestamp::now()));
    }
    Ok(())
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn since(then: i64, now: Timestamp) -> String {
    let seconds = ((now.0 - then).max(0) / 1000) as u64;
    HumanDuration(Duration::from_secs(seconds)).to_string()
}

fn seconds(ms: u64) -> String {
    HumanDuration(Duration::from_secs(ms / 1000)).to_string()
}

/// The back-off's line: its state, what it reads, the reading and the
/// thresholds.
fn render_backoff(backoff: &BackoffStatus) -> String {
    let pct = |p: Option<f64>| p.map_or("off".to_string(), |p| format!("{p:.2}%"));
    if backoff.state == "off" {
        return format!("back-off: off ({})\n", backoff.signal);
    }
    format!(
        "back-off: {}, pressure {} of {}; pause at {}, freeze at {}, thaw below {}, max-freeze {}; {} frozen\n",
        backoff.state,
        backoff
            .pressure
            .map_or("unknown".to_string(), |p| format!("{p:.2}%")),
        backoff.signal,
        pct(backoff.pause),
        pct(backoff.freeze),
        pct(backoff.thaw_below),
        seconds(backoff.max_freeze_ms),
        super::output::count(backoff.frozen as u64, "job", "jobs"),
    )
}

/// The status as text: one line for the process, then per pool its gate and
/// a table of its jobs.
pub fn render(status: &Status, now: Timestamp) -> String {
    let mut out = format!(
        "jobmgr supervisor pid {}: up {}, server {}\n",
        status.pid,
        since(status.started, now),
        status.server
    );
    if let Some(backoff) = &status.backoff {
        out.push_str(&render_backoff(backoff));
    }
    for pool in &status.pools {
        let load = pool
            .load1
            .map_or("unknown".to_string(), |l| format!("{l:.2}"));
        let held = pool.running.values().filter(|j| j.held).count();
        let frozen = pool.running.values().filter(|j| j.frozen).count();
        out.push_str(&format!(
            "pool {} ({}): gate {}, load {} of {:.2}, {} of {} busy{}{}\n",
            pool.name,
            pool.job_name,
            pool.gate,
            load,
            pool.max_load,
            pool.running.len() - held,
            super::output::count(pool.max_workers as u64, "worker", "workers"),
            if held > 0 {
                format!(", {held} held ahead")
            } else {
                String::new()
            },
            if frozen > 0 {
                format!(", {frozen} frozen")
            } else {
                String::new()
            }
        ));
        if pool.running.is_empty() {
            continue;
        }
        let width = pool
            .running
            .values()
            .map(|j| j.name.len())
            .max()
            .unwrap_or(0)
            .max(4);
        out.push_str(&format!(
            "  {:>8}  {:width$}  {:>8}  ELAPSED  {:13}  STARVED\n",
            "JOB", "NAME", "PID", "FROZEN"
        ));
        for (id, job) in &pool.running {
            let pid = match job.pid {
                Some(pid) => pid.to_string(),
                None if job.held => "held".to_string(),
                None => "-".to_string(),
            };
            let frozen = match (job.frozen, job.frozen_ms) {
                (true, ms) => format!("now, {} in all", seconds(ms)),
                (false, 0) => "-".to_string(),
                (false, ms) => seconds(ms),
            };
            let starved = job.starved_ms.map_or("-".to_string(), seconds);
            out.push_str(&format!(
                "  {id:>8}  {:width$}  {pid:>8}  {:7}  {frozen:13}  {starved}\n",
                job.name,
                since(job.since, now)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::status::StatusBoard;

    #[test]
    fn the_back_off_and_each_jobs_time_frozen_and_starved_are_shown() {
        let board = StatusBoard::new("embedded");
        let pool = board.pool("main", "*", 2.0, 4);
        let frozen = pool.running(7, "www/Report", false);
        frozen.started(4242);
        frozen.frozen(true, Duration::from_secs(95));
        frozen.starved(Duration::from_millis(12_400));
        let _calm = pool.running(8, "www/Mail", false);
        board.backoff(BackoffStatus {
            state: "freezing".into(),
            signal: "site cgroups /system.slice/php.service".into(),
            pressure: Some(31.5),
            pause: Some(10.0),
            freeze: Some(25.0),
            thaw_below: Some(10.0),
            max_freeze_ms: 300_000,
            frozen: 1,
        });
        let status = board.snapshot();
        let text = render(&status, Timestamp(status.started));
        assert!(
            text.contains(
                "back-off: freezing, pressure 31.50% of site cgroups /system.slice/php.service; pause at 10.00%, freeze at 25.00%, thaw below 10.00%, max-freeze 5m; 1 job frozen"
            ),
            "{text}"
        );
        assert!(text.contains("2 of 4 workers busy, 1 frozen"), "{text}");
        let row = text.lines().find(|l| l.contains("www/Report")).unwrap();
        assert!(row.contains("now, 1m 35s in all"), "{row}");
        assert!(row.ends_with(" 12s"), "starved 12 s: {row}");
        let row = text.lines().find(|l| l.contains("www/Mail")).unwrap();
        assert!(row.ends_with(" -              -"), "{row}");
        assert!(text.contains("FROZEN         STARVED"), "{text}");

        let mut off = status.clone();
        off.backoff = Some(BackoffStatus {
            state: "off".into(),
            signal: "none: /proc/pressure/memory does not exist".into(),
            ..BackoffStatus::default()
        });
        let text = render(&off, Timestamp(off.started));
        assert!(
            text.contains("back-off: off (none: /proc/pressure/memory does not exist)"),
            "{text}"
        );
    }
}
