//! The supervisor's own cgroup directories, for real: supervisors in PID
//! namespaces of their own (`unshare --pid --fork --mount-proc`, as in a
//! container sharing the cgroup tree) beside others, started, stopped and
//! killed while jobs run; and directories removed under a running
//! supervisor. Each test runs its supervisors in a cgroup of its own
//! ([`TestCgroup`]), so that they see no supervisor but the test's; a test
//! skips only without root, cgroups or `unshare`, and says so.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::common::*;

/// A supervisor's command line under this gets a PID namespace of its own
/// (it is pid 1 there) with its own `/proc`, and a session and process
/// group of its own (as in a container); it dies with `unshare`.
const UNSHARE: [&str; 6] = [
    "setsid",
    "unshare",
    "--pid",
    "--fork",
    "--mount-proc",
    "--kill-child",
];

/// Whether `unshare` can make a PID namespace here; says so when not.
fn unshare_here(test: &str) -> bool {
    let works = std::process::Command::new(UNSHARE[0])
        .args(&UNSHARE[1..])
        .arg("true")
        .run_bounded("unshare --pid true")
        .status
        .success();
    if !works {
        eprintln!("SKIPPED {test}: unshare --pid --fork --mount-proc does not work here");
    }
    works
}

/// The supervisor's sandbox line, once it is logged: by then its cgroups
/// are made and those of supervisors that are gone removed.
fn sandbox_line(sup: &Supervisor) -> String {
    wait_for("the sandbox line", sup, || {
        sup.stderr()
            .lines()
            .find(|l| l.contains("sandbox: "))
            .map(str::to_string)
    })
}

/// The supervisor's own cgroup directories, as its sandbox line names
/// them (`v2 at PATH (…)`, `v1 pids at PATH`).
fn cgroup_dirs(line: &str) -> Vec<PathBuf> {
    let Some(cgroups) = line.split("cgroups: ").nth(1) else {
        return Vec::new();
    };
    cgroups
        .split("; ")
        .take_while(|part| part.starts_with("v1 ") || part.starts_with("v2 "))
        .filter_map(|part| {
            let path = part.split(" at ").nth(1)?;
            Some(PathBuf::from(path.split(" (").next()?))
        })
        .collect()
}

/// The pid of the supervisor itself: the child of `unshare` when it runs
/// in a PID namespace, else the process the test started.
fn supervisor_pid(sup: &Supervisor, in_namespace: bool) -> i32 {
    if !in_namespace {
        return sup.pid() as i32;
    }
    wait_for("the supervisor under unshare", sup, || {
        children(sup.pid() as i32).first().copied()
    })
}

/// Sends `signal` to the supervisor at `pid`: the process the test started,
/// or, in a PID namespace, `unshare`'s child (pinned and checked to be it:
/// the test read its pid).
fn signal_supervisor(instance: &Instance, pid: i32, signal: Signal) {
    if !instance.in_namespace {
        instance.sup.signal(signal);
        return;
    }
    let unshare = instance.sup.pid() as i32;
    let sent = signal_if(pid, signal, |pid| children(unshare).contains(&pid));
    assert!(
        sent || signal == Signal::SIGKILL,
        "supervisor {} (pid {pid} under unshare) was not there to stop",
        instance.number
    );
}

/// The children of `pid`, from every thread's `children`.
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|task| std::fs::read_to_string(task.path().join("children")).unwrap_or_default())
        .collect::<Vec<String>>()
        .iter()
        .flat_map(|pids| pids.split_whitespace())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A job that runs until `$OUT/go` exists, with its pid in
/// `$OUT/started`.
fn held_job(out: &Path) -> String {
    sh(&format!(
        r#"cat > /dev/null
echo $$ > '{out}/started.tmp' && mv '{out}/started.tmp' '{out}/started'
while [ ! -e '{out}/go' ]; do sleep 0.05; done
touch '{out}/finished'"#,
        out = out.display()
    ))
}

/// A supervisor in a PID namespace of its own, sharing the cgroup tree,
/// starts beside one whose job runs: the job survives it and finishes.
#[test]
fn a_supervisor_in_another_pid_namespace_leaves_a_live_supervisors_job_alone() {
    let test = "a_supervisor_in_another_pid_namespace_leaves_a_live_supervisors_job_alone";
    let Some(cgroup) = TestCgroup::new(test) else {
        return;
    };
    if !unshare_here(test) {
        return;
    }
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url).in_cgroup(&cgroup);
    let out = builder.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let first = builder
        .worker("Held", &held_job(&out))
        .arg("--job-name")
        .arg("Held")
        .start();
    let first_dirs = cgroup_dirs(&sandbox_line(&first));
    assert!(!first_dirs.is_empty(), "{}", first.stderr());
    let id = api.create(json!({"name": "Held"}));
    let worker: i32 = wait_for("the job to start", &first, || {
        std::fs::read_to_string(out.join("started"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let marker = first.workers().display().to_string();
    assert!(alive_with(worker, &marker));

    // Pid 1 in its own namespace, where the first supervisor's pid is not.
    let second = Supervisor::builder(&server.url)
        .in_cgroup(&cgroup)
        .wrapped(&UNSHARE)
        .arg("--job-name")
        .arg("Other")
        .start();
    let second_dirs = cgroup_dirs(&sandbox_line(&second));
    assert!(!second_dirs.is_empty(), "{}", second.stderr());
    for dir in &second_dirs {
        assert!(
            !first_dirs.contains(dir),
            "the supervisors share the directory {}",
            dir.display()
        );
    }
    assert!(
        alive_with(worker, &marker),
        "the second supervisor's start killed the first one's job; its log:\n{}",
        second.stderr()
    );
    for dir in &first_dirs {
        assert!(dir.exists(), "{} was removed", dir.display());
    }

    std::fs::write(out.join("go"), "").unwrap();
    wait_for("the job to finish", &first, || {
        api.state(id).is_none().then_some(())
    });
    assert!(out.join("finished").exists());
    assert_eq!(api.outcomes(id), ["finished"]);
}

/// What each job of the stress test writes: `started-ID-ATTEMPT` (holding
/// its supervisor's number, written whole: through a rename, as a kill may
/// come between a file's creation and its write) when it starts, `ended-ID-ATTEMPT` when it ends
/// of itself, a second later. A child of its own that would outlive it by
/// half a minute is stopped at its end; one whose job is killed stays in
/// the job's cgroups.
const WORK: &str = r#"cat > /dev/null
sleep 30 &
lingering=$!
echo "$INSTANCE" > "$OUT/.starting-$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT"
mv "$OUT/.starting-$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT" "$OUT/started-$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT"
sleep 1
kill $lingering
touch "$OUT/ended-$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT""#;

/// One supervisor of the stress test.
struct Instance {
    number: usize,
    sup: Supervisor,
    in_namespace: bool,
    dirs: Vec<PathBuf>,
}

/// Randomized: several supervisors, some in PID namespaces of their own,
/// all in one cgroup, are started, stopped and killed (`kill -9` of the
/// supervisor, or of it and its spawner, which leaves its jobs' children
/// running) at random while jobs run. Counts violations: a job whose
/// supervisor was never killed that did not end of itself (another killed
/// it), and after each start a directory of a killed supervisor still
/// holding a process. None is allowed.
#[test]
fn supervisors_started_and_killed_at_random_across_pid_namespaces_never_kill_each_others_jobs() {
    let test = "supervisors_started_and_killed_at_random_across_pid_namespaces_never_kill_each_others_jobs";
    let Some(cgroup) = TestCgroup::new(test) else {
        return;
    };
    if !unshare_here(test) {
        return;
    }
    const STEPS: usize = 40;
    const MOST: usize = 4;
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = Server::start();
    let api = server.api();
    let shared = tempfile::tempdir().unwrap();
    let out = shared.path().to_path_buf();

    let start = |number: usize, in_namespace: bool| -> Instance {
        let mut builder = Supervisor::builder(&server.url)
            .in_cgroup(&cgroup)
            .worker("Work", &sh(WORK))
            .arg("--job-name")
            .arg("Work")
            .arg("--max-workers")
            .arg("2")
            .arg("--drain-timeout")
            .arg("60s")
            .arg("--env")
            .arg(&format!("INSTANCE={number}"))
            .arg("--env")
            .arg(&format!("OUT={}", out.display()));
        if in_namespace {
            builder = builder.wrapped(&UNSHARE);
        }
        let sup = builder.start();
        let dirs = cgroup_dirs(&sandbox_line(&sup));
        assert!(!dirs.is_empty(), "no cgroups: {}", sup.stderr());
        Instance {
            number,
            sup,
            in_namespace,
            dirs,
        }
    };

    let mut live: Vec<Instance> = Vec::new();
    let mut killed: HashSet<usize> = HashSet::new();
    let mut dead_dirs: Vec<(usize, PathBuf)> = Vec::new();
    let mut violations = Vec::new();
    let mut numbers = 0..;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    // Processes killed supervisors left running, seen before a start.
    let mut orphans = 0;
    for step in 0..STEPS {
        api.create_batch((0..3).map(|_| json!({"name": "Work"})).collect());
        let action = match live.len() {
            0 | 1 => "start",
            n if n >= MOST => ["kill", "kill_with_spawner", "stop"][rng.random_range(0..3)],
            _ => ["start", "start", "kill", "kill_with_spawner", "stop"][rng.random_range(0..5)],
        };
        *counts.entry(action).or_default() += 1;
        match action {
            "start" => {
                orphans += dead_dirs
                    .iter()
                    .map(|(_, dir)| pids_below(dir).len())
                    .sum::<usize>();
                let number = numbers.next().unwrap();
                let instance = start(number, rng.random_bool(0.5));
                // Its start removed what killed supervisors left running.
                for (owner, dir) in &dead_dirs {
                    let left = pids_below(dir);
                    if !left.is_empty() {
                        violations.push(format!(
                            "step {step}: after supervisor {number} started, {} of killed supervisor {owner} still holds {left:?}",
                            dir.display()
                        ));
                    }
                }
                live.push(instance);
            }
            "kill" | "kill_with_spawner" => {
                let mut instance = live.swap_remove(rng.random_range(0..live.len()));
                let pid = supervisor_pid(&instance.sup, instance.in_namespace);
                if action == "kill_with_spawner" {
                    for child in children(pid) {
                        signal_if(child, Signal::SIGKILL, |c| children(pid).contains(&c));
                    }
                }
                signal_supervisor(&instance, pid, Signal::SIGKILL);
                instance.sup.kill9();
                killed.insert(instance.number);
                dead_dirs.extend(instance.dirs.iter().map(|d| (instance.number, d.clone())));
            }
            _ => {
                let mut instance = live.swap_remove(rng.random_range(0..live.len()));
                let pid = supervisor_pid(&instance.sup, instance.in_namespace);
                signal_supervisor(&instance, pid, Signal::SIGTERM);
                instance.sup.wait_exit();
            }
        }
    }
    for mut instance in live.drain(..) {
        let pid = supervisor_pid(&instance.sup, instance.in_namespace);
        signal_supervisor(&instance, pid, Signal::SIGTERM);
        instance.sup.wait_exit();
    }

    let mut started = 0;
    for entry in std::fs::read_dir(&out).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(run) = name.strip_prefix("started-") else {
            continue;
        };
        started += 1;
        let owner: usize = std::fs::read_to_string(entry.path())
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if !killed.contains(&owner) && !out.join(format!("ended-{run}")).exists() {
            violations.push(format!(
                "job run {run} of supervisor {owner}, never killed, did not end of itself"
            ));
        }
    }
    println!(
        "{STEPS} steps ({counts:?}), {started} job runs, {} supervisors killed, {orphans} processes they left found before a start",
        killed.len()
    );
    assert!(started > 0, "no job ran (seed {seed})");
    assert!(
        violations.is_empty(),
        "{} violations (seed {seed}):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// A supervisor whose cgroup directories are removed while it runs (an
/// `rmdir` of each, empty between jobs) makes them again for its next
/// jobs, which run; and where they cannot be made (the cgroup allows no
/// more below it), a job goes back to the queue, saying why, and runs once
/// they can. No job fails for it.
#[test]
fn a_supervisor_whose_cgroup_directories_disappear_makes_them_again_and_fails_no_job() {
    let test = "a_supervisor_whose_cgroup_directories_disappear_makes_them_again_and_fails_no_job";
    let Some(cgroup) = TestCgroup::new(test) else {
        return;
    };
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .in_cgroup(&cgroup)
        .worker("Quick", &sh("cat > /dev/null\necho ran"))
        .start();
    let dirs = cgroup_dirs(&sandbox_line(&sup));
    assert!(dirs.len() >= 2, "a v2 and a v1 directory: {dirs:?}");
    let run = |what: &str| {
        let id = api.create(json!({"name": "Quick"}));
        wait_for(what, &sup, || api.state(id).is_none().then_some(()));
        assert_eq!(api.outcomes(id), ["finished"], "{what}");
    };
    run("a job before the directories go");

    let remove_all = || {
        for dir in &dirs {
            wait_for(&format!("{} to be removed", dir.display()), &sup, || {
                std::fs::remove_dir(dir).ok()
            });
        }
    };
    remove_all();
    for i in 0..3 {
        run(&format!("job {i} after the directories went"));
    }
    for dir in &dirs {
        assert!(dir.exists(), "{} was not made again", dir.display());
    }

    // Gone again, and no more cgroups may be made: the job goes back.
    remove_all();
    let limit = cgroup.v2().join("cgroup.max.descendants");
    std::fs::write(&limit, "0").unwrap();
    let id = api.create(json!({"name": "Quick"}));
    wait_for("the job to be handed back", &sup, || {
        sup.stderr()
            .contains("cannot make the job's cgroups, so the job goes back to the queue")
            .then_some(())
    });
    std::fs::write(&limit, "max").unwrap();
    wait_for("the job to run once cgroups can be made", &sup, || {
        api.state(id).is_none().then_some(())
    });
    let outcomes = api.outcomes(id);
    assert_eq!(
        outcomes.last().map(String::as_str),
        Some("finished"),
        "{outcomes:?}"
    );
    assert!(
        !outcomes.iter().any(|o| o == "failed"),
        "the job counted a failed run: {outcomes:?}"
    );
    assert!(
        !sup.stderr().contains("the worker could not be started"),
        "a job counted a run that could not start: {}",
        sup.stderr()
    );
}
