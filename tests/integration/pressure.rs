//! The CPU pressure gate (`--max-cpu-pressure`): pressure at or above the
//! limit holds jobs back, below it lets them run, and a kernel without the
//! pressure file is said once at start. The pressure is set through
//! `--cpu-pressure-path`, a file in `/proc/pressure/cpu` format that the
//! test writes: the only way a test can set it.

use std::path::Path;

use serde_json::json;

use crate::common::*;

fn write_pressure(path: &Path, avg10: f64) {
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!(
            "some avg10={avg10:.2} avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        ),
    )
    .expect("pressure file");
    std::fs::rename(&tmp, path).expect("pressure file");
}

#[test]
fn pressure_above_the_limit_holds_jobs_and_below_lets_them_run() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url).worker("Pressed", &sh("exit 0"));
    let psi = builder.path().join("pressure-cpu");
    // High pressure from the start, so no fetch is made before the gate sees it.
    write_pressure(&psi, 80.0);
    let sup = builder
        .arg("--max-cpu-pressure")
        .arg("20")
        .arg("--cpu-pressure-path")
        .arg(psi.to_str().expect("path"))
        .start();
    let id = api.create(json!({"name": "Pressed"}));
    wait_for("the gate to say the CPU pressure closed it", &sup, || {
        sup.stderr()
            .lines()
            .any(|l| l.contains("gate closed") && l.contains("CPU pressure 80.00%"))
            .then_some(())
    });
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"), "{}", sup.logs());
    let (_, health) = api.get("/healthz");
    assert_eq!(
        health["waiting"], 0,
        "a closed gate asks for jobs: {health}"
    );

    write_pressure(&psi, 5.0);
    wait_for("the job to run once the pressure drops", &sup, || {
        api.state(id).is_none().then_some(())
    });
}

#[test]
fn a_missing_pressure_file_is_said_once_and_the_gate_is_off() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url).worker("Unpressed", &sh("exit 0"));
    let absent = builder.path().join("no-such-pressure-file");
    let sup = builder
        .arg("--max-cpu-pressure")
        .arg("20")
        .arg("--cpu-pressure-path")
        .arg(absent.to_str().expect("path"))
        .start();
    let id = api.create(json!({"name": "Unpressed"}));
    wait_for("the job to run with the pressure gate off", &sup, || {
        api.state(id).is_none().then_some(())
    });
    let said = sup
        .stderr()
        .lines()
        .filter(|l| l.contains("the CPU pressure gate is off"))
        .count();
    assert_eq!(said, 1, "{}", sup.stderr());
}

#[test]
fn a_pressure_limit_outside_0_to_100_is_refused() {
    let (code, _, stderr) = {
        let output = std::process::Command::new(bin())
            .args([
                "check-config",
                "--worker-path",
                "/",
                "--max-cpu-pressure",
                "150",
            ])
            .run_bounded("check-config --max-cpu-pressure 150");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("max-cpu-pressure"), "{stderr}");
}
