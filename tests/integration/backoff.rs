//! The back-off under site pressure: the pressure is scripted through
//! `--pressure-dir` (the test writes `memory` in `/proc/pressure` format
//! there, whose `full avg10` is the system-wide signal), and the jobs are
//! real workers whose freezing is read from the kernel (their v2 cgroup's
//! `cgroup.events`, or the process state `T` of a stopped process).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::common::*;

/// A worker that writes its pid to `started` in the scratch-independent
/// directory `dir`, counts its runs in `runs`, then waits for the file
/// `go` and exits 0.
fn waiting_worker(dir: &Path) -> String {
    let d = dir.display();
    sh(&format!(
        "echo run >> '{d}/runs'\necho $$ > '{d}/pid.tmp' && mv '{d}/pid.tmp' '{d}/pid'\nwhile [ ! -e '{d}/go' ]; do sleep 0.05; done\nexit 0"
    ))
}

/// The worker's pid, once it wrote it.
fn worker_pid(dir: &Path, sup: &Supervisor) -> i32 {
    wait_for("the worker to start", sup, || {
        std::fs::read_to_string(dir.join("pid"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    })
}

/// Whether the kernel has the process frozen: stopped (`T`, by SIGSTOP),
/// or in a v2 cgroup (not the root) asked to freeze that says `frozen 1`.
fn frozen(pid: i32) -> bool {
    stopped(pid) || cgroup_frozen(pid)
}

/// Whether the process is stopped (state `T`).
fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
        .unwrap_or(false)
}

/// Whether the process's v2 cgroup (not the root) is asked to freeze and
/// says `frozen 1`.
fn cgroup_frozen(pid: i32) -> bool {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let v2 = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| *p != "/")
        .and_then(|p| {
            ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .map(|m| PathBuf::from(format!("{m}{p}")))
                .find(|d| d.join("cgroup.freeze").exists())
        });
    v2.is_some_and(|dir| {
        let events = std::fs::read_to_string(dir.join("cgroup.events")).unwrap_or_default();
        let asked = std::fs::read_to_string(dir.join("cgroup.freeze")).unwrap_or_default();
        asked.trim() == "1" && events.lines().any(|l| l == "frozen 1")
    })
}

/// Sets the system-wide memory pressure (`full avg10`) the supervisor reads.
fn press(dir: &Path, full: f64) {
    write_psi(&dir.join("pressure/memory"), full, full);
}

/// The supervisor's status file, read.
fn status(sup: &Supervisor) -> serde_json::Value {
    let text = std::fs::read_to_string(sup.dir.path().join("status.json")).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_default()
}

#[test]
fn jobs_freeze_above_the_freeze_threshold_and_thaw_below_the_pause_one() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let builder = Supervisor::builder(&server.url).worker("Frozen", &waiting_worker(marks.path()));
    let sup = builder
        .arg("--pause-pressure")
        .arg("10")
        .arg("--freeze-pressure")
        .arg("25")
        .start();
    let id = api.create(json!({"name": "Frozen"}));
    let pid = worker_pid(marks.path(), &sup);
    assert!(!frozen(pid), "not frozen while the site is calm");

    // Above the freeze threshold: frozen through its own cgroup, said in
    // the status file.
    press(sup.dir.path(), 30.0);
    wait_for("the job's cgroup to be frozen", &sup, || {
        cgroup_frozen(pid).then_some(())
    });
    wait_for("the status to show the job frozen", &sup, || {
        let status = status(&sup);
        let job = &status["pools"][0]["running"][id.to_string()];
        (status["backoff"]["state"] == "freezing" && job["frozen"] == true).then_some(())
    });
    let (code, out, err) = jobmgr_with(
        &[],
        &[
            "status",
            "--status-file",
            sup.dir.path().join("status.json").to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("back-off: freezing") && out.contains("1 frozen"),
        "{out}"
    );

    // Between the thresholds: still frozen (hysteresis).
    press(sup.dir.path(), 15.0);
    wait_for("the status to show the reading of 15%", &sup, || {
        (status(&sup)["backoff"]["pressure"] == 15.0).then_some(())
    });
    assert!(frozen(pid), "thawed above the pause threshold");

    // Below the pause threshold: thawed, and the job runs to its end.
    press(sup.dir.path(), 5.0);
    wait_for("the job to thaw", &sup, || (!frozen(pid)).then_some(()));
    std::fs::write(marks.path().join("go"), "").unwrap();
    wait_for("the job to finish", &sup, || {
        api.state(id).is_none().then_some(())
    });
    let runs = std::fs::read_to_string(marks.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "{runs}");
    let stderr = sup.stderr();
    assert!(
        stderr.contains("job frozen") && stderr.contains("job thawed"),
        "{stderr}"
    );
}

#[test]
fn above_the_pause_threshold_a_queued_job_waits_until_the_pressure_falls() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url).worker("Paused", &sh("exit 0"));
    // Pressed from the start, so that no fetch is made before the gate sees it.
    write_psi(&builder.path().join("pressure/memory"), 0.0, 15.0);
    let sup = builder.start();
    let id = api.create(json!({"name": "Paused"}));
    wait_for("the gate to close for the site's pressure", &sup, || {
        sup.stderr()
            .lines()
            .any(|l| {
                l.contains("gate closed")
                    && l.contains("site pressure 15.00% is at or above pause-pressure 10.00%")
            })
            .then_some(())
    });
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"), "{}", sup.logs());
    wait_for("the status to say the back-off pauses", &sup, || {
        (status(&sup)["backoff"]["state"] == "paused").then_some(())
    });

    press(sup.dir.path(), 2.0);
    wait_for("the job to run once the pressure falls", &sup, || {
        api.state(id).is_none().then_some(())
    });
}

/// Frozen for longer than its timeout and its lease: the job keeps its
/// lease (renewed by the supervisor all along), is not timed out, and runs
/// exactly once.
#[test]
fn a_frozen_job_keeps_its_lease_and_its_timeout_does_not_count_the_freeze() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let sup = Supervisor::builder(&server.url)
        .worker("Long", &waiting_worker(marks.path()))
        .arg("--timeout")
        .arg("6s")
        .arg("--lease")
        .arg("1s")
        .start();
    let id = api.create(json!({"name": "Long"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 50.0);
    wait_for("the job to be frozen", &sup, || frozen(pid).then_some(()));
    // Held frozen past both the timeout and several lease terms (a hold,
    // not a measurement: the test asserts what happens, not when).
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        frozen(pid),
        "thawed while the pressure stays: {}",
        sup.logs()
    );
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"), "{}", sup.logs());
    // The worker may go on once thawed.
    std::fs::write(marks.path().join("go"), "").unwrap();
    press(sup.dir.path(), 0.0);
    wait_for("the job to finish", &sup, || {
        api.state(id).is_none().then_some(())
    });
    assert_eq!(
        api.outcomes(id),
        vec!["finished".to_string()],
        "{}",
        sup.logs()
    );
    let runs = std::fs::read_to_string(marks.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "run once: {runs}");
    let stderr = sup.stderr();
    assert!(!stderr.contains("timed out"), "{stderr}");
    assert!(!stderr.contains("lease lost"), "{stderr}");
}

#[test]
fn a_job_frozen_for_max_freeze_is_thawed_with_a_warning_though_the_pressure_stays() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let sup = Supervisor::builder(&server.url)
        .worker("Overdue", &waiting_worker(marks.path()))
        .arg("--max-freeze")
        .arg("2s")
        .start();
    let id = api.create(json!({"name": "Overdue"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 90.0);
    wait_for("the job to be frozen", &sup, || frozen(pid).then_some(()));
    wait_for("the max-freeze warning naming the job", &sup, || {
        sup.stderr()
            .lines()
            .any(|l| {
                l.contains("WARN")
                    && l.contains("max-freeze")
                    && l.contains(&format!("job_id={id}"))
                    && l.contains("Overdue")
            })
            .then_some(())
    });
    wait_for("the job to be thawed by max-freeze", &sup, || {
        (!frozen(pid)).then_some(())
    });
    assert_eq!(
        status(&sup)["backoff"]["pressure"],
        90.0,
        "the site is still pressed"
    );
    std::fs::write(marks.path().join("go"), "").unwrap();
    wait_for("the job to finish while the site is pressed", &sup, || {
        api.state(id).is_none().then_some(())
    });
}

/// A drain thaws a frozen job, which then finishes within the drain.
#[test]
fn a_drain_thaws_frozen_jobs() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let mut sup = Supervisor::builder(&server.url)
        .worker("Drained", &waiting_worker(marks.path()))
        .start();
    let id = api.create(json!({"name": "Drained"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 90.0);
    wait_for("the job to be frozen", &sup, || frozen(pid).then_some(()));
    std::fs::write(marks.path().join("go"), "").unwrap();
    sup.signal(nix::sys::signal::Signal::SIGTERM);
    let status = sup.wait_exit();
    assert!(status.success(), "{status}: {}", sup.stderr());
    assert_eq!(
        api.outcomes(id),
        vec!["finished".to_string()],
        "{}",
        sup.stderr()
    );
}

/// `jobmgr check-config` with these flags (as the start checks them).
fn check_config(dir: &Path, args: &[&str]) -> (i32, String) {
    let empty = dir.join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let mut all = vec![
        "check-config",
        "--config",
        empty.to_str().unwrap(),
        "--worker-path",
        "/",
    ];
    all.extend_from_slice(args);
    let (code, _, stderr) = jobmgr_with(&[], &all);
    (code, stderr)
}

#[test]
fn bad_thresholds_malformed_pressure_files_and_a_missing_site_cgroup_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let psi = dir.path().join("pressure");
    std::fs::create_dir(&psi).unwrap();
    write_psi(&psi.join("memory"), 0.0, 0.0);
    let psi_arg = psi.to_str().unwrap();

    for (flag, value) in [
        ("--freeze-pressure", "120"),
        ("--pause-pressure", "abc"),
        ("--pause-pressure", "0"),
    ] {
        let (code, stderr) = check_config(dir.path(), &[&format!("{flag}={value}")]);
        assert_eq!(code, 2, "{flag}={value}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("at most 100") && stderr.contains("off"),
            "{flag}={value}: {stderr}"
        );
    }
    let (code, stderr) = check_config(
        dir.path(),
        &["--pause-pressure", "30", "--freeze-pressure", "20"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("must be below freeze-pressure"), "{stderr}");

    std::fs::write(psi.join("memory"), "some avg10=oops\n").unwrap();
    let (code, stderr) = check_config(dir.path(), &["--pressure-dir", psi_arg]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&psi.join("memory").display().to_string())
            && stderr.contains("full avg10="),
        "{stderr}"
    );

    // The supervisor itself refuses to start on a missing site cgroup.
    let empty = dir.path().join("empty.toml");
    let (code, _, stderr) = jobmgr_with(
        &[("JOBMGR_TOKEN", token())],
        &[
            "--config",
            empty.to_str().unwrap(),
            "--server",
            "http://127.0.0.1:1",
            "--worker-path",
            "/",
            "--site-cgroup",
            "/system.slice/no-such-site.service",
        ],
    );
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("/system.slice/no-such-site.service") && stderr.contains("does not exist"),
        "{stderr}"
    );
}

/// A pressure file that goes bad while the supervisor runs is said, and
/// the jobs it froze thaw (no freeze on no evidence).
#[test]
fn a_pressure_file_gone_bad_is_said_and_thaws_jobs() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let sup = Supervisor::builder(&server.url)
        .worker("Garbled", &waiting_worker(marks.path()))
        .start();
    let id = api.create(json!({"name": "Garbled"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 90.0);
    wait_for("the job to be frozen", &sup, || frozen(pid).then_some(()));
    let memory = sup.dir.path().join("pressure/memory");
    std::fs::write(memory.with_extension("tmp"), "full avg10=lots\n").unwrap();
    std::fs::rename(memory.with_extension("tmp"), &memory).unwrap();
    wait_for("the bad file to be said", &sup, || {
        sup.stderr()
            .lines()
            .any(|l| l.contains("cannot read the pressure") && l.contains("not a pressure file"))
            .then_some(())
    });
    wait_for("the job to thaw", &sup, || (!frozen(pid)).then_some(()));
    std::fs::write(marks.path().join("go"), "").unwrap();
    wait_for("the job to finish", &sup, || {
        api.state(id).is_none().then_some(())
    });
}

/// With site cgroups, their `some` pressure is followed (here, a site
/// cgroup under `--pressure-dir`, in the v2 mount's layout).
#[test]
fn a_site_cgroups_pressure_freezes_jobs() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let builder = Supervisor::builder(&server.url).worker("Site", &waiting_worker(marks.path()));
    let site = builder.path().join("pressure/system.slice/php-fpm.service");
    std::fs::create_dir_all(&site).unwrap();
    for resource in ["cpu", "memory", "io"] {
        write_psi(&site.join(format!("{resource}.pressure")), 0.0, 0.0);
    }
    let sup = builder
        .arg("--site-cgroup")
        .arg("/system.slice/php-fpm.service")
        .start();
    wait_for("the start to say which signal it follows", &sup, || {
        sup.stderr()
            .lines()
            .any(|l| l.contains("back-off following site cgroups /system.slice/php-fpm.service"))
            .then_some(())
    });
    let id = api.create(json!({"name": "Site"}));
    let pid = worker_pid(marks.path(), &sup);
    // The system-wide file does not count with site cgroups: the reading
    // is the site's.
    press(sup.dir.path(), 90.0);
    write_psi(&site.join("io.pressure"), 20.0, 0.0);
    wait_for("the site's reading of 20%", &sup, || {
        (status(&sup)["backoff"]["pressure"] == 20.0).then_some(())
    });
    assert!(!frozen(pid), "frozen below freeze-pressure: {}", sup.logs());
    write_psi(&site.join("io.pressure"), 40.0, 0.0);
    wait_for("the job to be frozen", &sup, || frozen(pid).then_some(()));
    write_psi(&site.join("io.pressure"), 1.0, 0.0);
    wait_for("the job to thaw", &sup, || (!frozen(pid)).then_some(()));
    std::fs::write(marks.path().join("go"), "").unwrap();
    wait_for("the job to finish", &sup, || {
        api.state(id).is_none().then_some(())
    });
}

/// The cells of the dashboard's Supervisors row naming `id`, as text.
fn supervisor_row(page: &str, id: &str) -> Option<Vec<String>> {
    let row = page
        .split("<tr>")
        .find(|row| row.contains(&format!("<td>{id}</td>")))?;
    Some(
        row.split("<td")
            .skip(1)
            .map(|cell| {
                let text = cell.split_once('>').map_or("", |(_, rest)| rest);
                text.split('<').next().unwrap_or("").trim().to_string()
            })
            .collect(),
    )
}

/// A supervisor's frozen jobs reach the job server: its worker registry
/// (`GET /workers`) and the dashboard's Supervisors page, beside its busy
/// ones; and the metrics count them.
#[test]
fn the_server_and_its_dashboard_see_a_supervisors_frozen_jobs() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let sup = Supervisor::builder(&server.url)
        .worker("Seen", &waiting_worker(marks.path()))
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .start();
    let id = api.create(json!({"name": "Seen"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 60.0);
    wait_for("the job to be frozen", &sup, || frozen(pid).then_some(()));
    let worker = wait_for("the registry to show one frozen job", &sup, || {
        let (_, workers) = api.get("/workers");
        workers["workers"]
            .as_array()?
            .iter()
            .find(|w| w["frozen"] == 1 && w["running"] == 1)
            .cloned()
    });
    let worker_id = worker["id"].as_str().expect("the worker's id").to_string();
    let cookie = crate::ui::cookie_of(&crate::ui::log_in(&server.url, token()));
    let (status, page) = crate::ui::get(&server.url, "/ui/supervisors", Some(&cookie));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(">Frozen</th>"), "{page}");
    let cells = supervisor_row(&page, &worker_id).unwrap_or_else(|| panic!("{page}"));
    // Supervisor, State, Last seen, Capacity, Busy, Frozen, …
    assert_eq!(
        (cells[4].as_str(), cells[5].as_str()),
        ("1", "1"),
        "{cells:?}"
    );

    let metrics = sup.ready_field("metrics");
    let text = scrape_until(&metrics, "a frozen job in the metrics", |text| {
        sample(text, "jobmgr_jobs_frozen", &[]) == Some(1.0)
            && sample(text, "jobmgr_site_pressure", &[]) == Some(60.0)
    });
    assert!(text.contains("jobmgr_job_frozen_seconds_total"), "{text}");
    std::fs::write(marks.path().join("go"), "").unwrap();
    press(sup.dir.path(), 0.0);
    wait_for("the job to finish", &sup, || {
        api.state(id).is_none().then_some(())
    });
}

/// Without cgroups, a job is frozen by SIGSTOP to its process group, and
/// thawed by SIGCONT.
#[test]
fn without_cgroups_a_job_is_stopped_and_continued() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let sup = Supervisor::builder(&server.url)
        .worker("Stopped", &waiting_worker(marks.path()))
        .without_cgroups()
        .start();
    let id = api.create(json!({"name": "Stopped"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 60.0);
    wait_for("the worker to be stopped", &sup, || {
        stopped(pid).then_some(())
    });
    press(sup.dir.path(), 0.0);
    wait_for("the worker to go on", &sup, || {
        (!stopped(pid)).then_some(())
    });
    std::fs::write(marks.path().join("go"), "").unwrap();
    wait_for("the job to finish", &sup, || {
        api.state(id).is_none().then_some(())
    });
    assert_eq!(
        api.outcomes(id),
        vec!["finished".to_string()],
        "{}",
        sup.logs()
    );
}

/// A frozen job whose lease is lost is stopped as any other: thawed first,
/// so that its SIGTERM reaches it (a frozen process would only die of the
/// SIGKILL after the grace).
#[test]
fn a_frozen_job_stopped_for_a_lost_lease_is_thawed_to_take_its_sigterm() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let d = marks.path().display();
    let worker = sh(&format!(
        "trap 'echo term > \"{d}/termed\"; exit 0' TERM\necho $$ > '{d}/pid.tmp' && mv '{d}/pid.tmp' '{d}/pid'\nwhile :; do sleep 0.05; done"
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Lost", &worker)
        .arg("--lease")
        .arg("1s")
        .start();
    let id = api.create(json!({"name": "Lost"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 60.0);
    wait_for("the job to be frozen", &sup, || frozen(pid).then_some(()));
    // Someone else's lease now: the next renewal is refused.
    let changed = server.store_execute(&format!(
        "UPDATE jobs SET lease_token = 'taken-by-another' WHERE job_id = {id}"
    ));
    assert_eq!(changed, 1);
    wait_for("the worker to take its SIGTERM", &sup, || {
        marks.path().join("termed").exists().then_some(())
    });
    assert!(sup.stderr().contains("lease lost"), "{}", sup.stderr());
}

/// The thresholds are re-read on SIGHUP and apply at once.
#[test]
fn a_reload_changes_the_thresholds() {
    let server = Server::start();
    let api = server.api();
    let marks = tempfile::tempdir().unwrap();
    let builder =
        Supervisor::builder(&server.url).worker("Reloaded", &waiting_worker(marks.path()));
    let config = builder.path().join("jobmgr.toml");
    std::fs::write(&config, "freeze-pressure = \"off\"\n").unwrap();
    let sup = builder
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start();
    let id = api.create(json!({"name": "Reloaded"}));
    let pid = worker_pid(marks.path(), &sup);
    press(sup.dir.path(), 60.0);
    wait_for("the reading of 60% with freezing off", &sup, || {
        let backoff = status(&sup)["backoff"].clone();
        (backoff["pressure"] == 60.0 && backoff["state"] == "paused").then_some(())
    });
    assert!(
        !frozen(pid),
        "frozen with freeze-pressure off: {}",
        sup.logs()
    );

    std::fs::write(&config, "freeze-pressure = 50\n").unwrap();
    sup.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the job to be frozen after the reload", &sup, || {
        frozen(pid).then_some(())
    });
    press(sup.dir.path(), 0.0);
    wait_for("the job to thaw", &sup, || (!frozen(pid)).then_some(()));
    std::fs::write(marks.path().join("go"), "").unwrap();
    wait_for("the job to finish", &sup, || {
        api.state(id).is_none().then_some(())
    });
}
