//! Fuzzes the configuration loader: TOML files parsed into supervisor
//! options (`config::parse_file`), layered as the main file and its
//! `conf.d/` drop-ins are (`config::merge_layers`), and resolved into the
//! supervisor's settings, one per `[[pool]]` (`Settings::resolve_pools`),
//! with `[[job]]` and `[[schedule]]` tables.
//!
//! The input is the text of up to four files, separated by lines of
//! `#---`: the first is the main file, the others drop-ins in order.
//!
//! Properties:
//! - nothing panics, neither loading nor using what was loaded: the
//!   effective settings (`jobmgr check-config`), which `[[job]]` table a
//!   name falls under, every retry delay;
//! - a refused file's error names the file;
//! - the options a file sets, written back as TOML (what check-config's
//!   provenance reads), load again as the same options;
//! - the layers merge as documented: `[[job]]`, `[[schedule]]` and
//!   `[[pool]]` tables add up in file order, and for any other key the last
//!   file that sets it wins;
//! - resolved settings are usable: at least one worker, a lease the
//!   heartbeat can renew, an output cap of at least 2 bytes, retry delays
//!   within the configured maximum (plus jitter).
//!
//! Run (from fuzz/; new inputs go to the first directory, the seeds in
//! corpus/ stay as they are):
//! `cargo +nightly fuzz run config /tmp/config_corpus corpus/config -- -runs=3000000 -max_len=4096`

#![no_main]

use std::path::{Path, PathBuf};
use std::time::Duration;

use jobmgr::config::{self, Layer, SupervisorOptions};
use jobmgr::supervisor::Settings;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
});

fn check(text: &str) {
    let mut layers = Vec::new();
    for (i, file) in text.split("\n#---\n").take(4).enumerate() {
        let path = if i == 0 {
            PathBuf::from("/etc/jobmgr/jobmgr.toml")
        } else {
            PathBuf::from(format!("/etc/jobmgr/conf.d/{i:02}.toml"))
        };
        match config::parse_file(&path, file) {
            Ok(options) => {
                round_trip(&path, &options);
                layers.push(Layer { path, options });
            }
            Err(error) => {
                let message = error.to_string();
                assert!(
                    message.contains(&path.display().to_string()),
                    "the error does not name the file: {message}"
                );
            }
        }
    }
    let merged = config::merge_layers(&layers);
    check_merge(&layers, &merged);

    // The supervisor needs a worker path; give one where the files do not.
    let mut options = merged;
    options.worker_path.get_or_insert_with(|| "/code".into());
    let Ok(pools) = Settings::resolve_pools(&options, Path::new("/var/lib/jobmgr")) else {
        return;
    };
    assert!(!pools.is_empty());
    for settings in &pools {
        use_settings(settings);
    }
}

/// The options a file sets, written as TOML and read again, are the same.
fn round_trip(path: &Path, options: &SupervisorOptions) {
    if has_nan(options) {
        return;
    }
    let written = toml::to_string(options)
        .unwrap_or_else(|e| panic!("options that loaded cannot be written: {e}\n{options:?}"));
    let again = config::parse_file(path, &written)
        .unwrap_or_else(|e| panic!("written options do not load: {e}\n{written}"));
    assert_eq!(&again, options, "written as:\n{written}");
    let keys = config::set_keys(options);
    let set = toml::Table::try_from(options).expect("a table");
    assert_eq!(keys, set);
}

/// NaN is not equal to itself, so options holding it cannot compare.
fn has_nan(options: &SupervisorOptions) -> bool {
    let floats = [options.max_load, options.cpu_max]
        .into_iter()
        .chain(options.pool.iter().flatten().map(|p| p.max_load))
        .chain(options.job.iter().flatten().map(|j| j.cpu_max));
    floats.flatten().any(f64::is_nan)
}

/// Tables add up in file order; any other key: the last file setting it.
fn check_merge(layers: &[Layer], merged: &SupervisorOptions) {
    let tables = |pick: fn(&SupervisorOptions) -> Option<usize>| {
        let counts: Vec<usize> = layers.iter().filter_map(|l| pick(&l.options)).collect();
        (!counts.is_empty()).then(|| counts.iter().sum::<usize>())
    };
    assert_eq!(
        merged.job.as_ref().map(Vec::len),
        tables(|o| o.job.as_ref().map(Vec::len))
    );
    assert_eq!(
        merged.schedule.as_ref().map(Vec::len),
        tables(|o| o.schedule.as_ref().map(Vec::len))
    );
    assert_eq!(
        merged.pool.as_ref().map(Vec::len),
        tables(|o| o.pool.as_ref().map(Vec::len))
    );
    let merged_keys = config::set_keys(merged);
    for (key, value) in &merged_keys {
        if matches!(key.as_str(), "job" | "schedule" | "pool") {
            continue;
        }
        let last = layers
            .iter()
            .rev()
            .map(|l| config::set_keys(&l.options))
            .find_map(|keys| keys.get(key).cloned());
        // As text: NaN, which a file may set, is not equal to itself.
        assert_eq!(
            last.map(|v| v.to_string()),
            Some(value.to_string()),
            "key {key}"
        );
    }
    for layer in layers {
        for key in config::set_keys(&layer.options).keys() {
            assert!(merged_keys.contains_key(key), "{key} lost in the merge");
        }
    }
}

/// What the supervisor does with its settings, none of which may panic.
fn use_settings(settings: &Settings) {
    assert!(settings.gate.max_workers >= 1);
    assert!(settings.gate.ramp >= 1);
    assert!(settings.output_cap >= 2);
    assert!(settings.lease >= Duration::from_millis(300));
    assert!(settings.gate.max_load > 0.0 && !settings.gate.max_load.is_nan());
    let effective = settings.effective();
    assert!(!effective.is_empty());
    for name in ["", "Hello", "www-prod/SendEmail?x=1", "batch/a.b-c"] {
        let (rule, job) = settings.for_job(name);
        assert!(rule <= settings.rules.len());
        assert!(job.retry.max_attempts >= 1);
        assert!(!job.timeout.is_zero());
    }
    let all = std::iter::once(&settings.job).chain(settings.rules.iter().map(|(_, j)| j));
    for job in all {
        let policy = &job.retry;
        for attempt in [0, 1, 2, 3, 10, 31, 64, i64::MAX] {
            let delay = policy.delay(attempt);
            let most = policy.max_backoff.as_secs_f64() * 1.25;
            assert!(
                delay.as_secs_f64() <= most * (1.0 + 1e-9) + 1e-9,
                "delay {delay:?} over {most}s"
            );
        }
    }
}
