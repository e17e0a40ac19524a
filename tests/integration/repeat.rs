//! Repeats: the calendar agrees with SQLite's own `datetime()` (property
//! tests against an in-memory SQLite), the GLOB matcher agrees with SQLite's
//! `GLOB`, and the real server schedules the next run of a repeating job from
//! the base the repeat names.

use std::cell::RefCell;

use jobmgr::protocol::pattern::glob_matches;
use jobmgr::protocol::{Modifier, Timestamp};
use jobmgr::server::calendar;
use proptest::prelude::*;
use rusqlite::Connection;
use serde_json::{Value, json};

use crate::common::*;

thread_local! {
    static SQLITE: RefCell<Connection> =
        RefCell::new(Connection::open_in_memory().expect("in-memory SQLite"));
}

/// SQLite's answer to `sql` with `params` bound as text, as optional text.
/// A time outside the years 0000 to 9999 (SQLite writes `-0001-…`) counts
/// as none: jobmgr cannot write such a time, so its calendar finds none.
fn sqlite_text(sql: &str, params: &[String]) -> Option<String> {
    SQLITE
        .with(|conn| {
            let conn = conn.borrow();
            let refs: Vec<&dyn rusqlite::ToSql> =
                params.iter().map(|p| p as &dyn rusqlite::ToSql).collect();
            conn.query_row(sql, refs.as_slice(), |row| row.get::<_, Option<String>>(0))
                .unwrap_or_else(|e| panic!("SQLite refused {sql:?} with {params:?}: {e}"))
        })
        .filter(|time| {
            let year = time.as_bytes().get(..5).unwrap_or_default();
            year.len() == 5 && year[..4].iter().all(u8::is_ascii_digit) && year[4] == b'-'
        })
}

fn placeholders(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|i| format!(", ?{i}"))
        .collect::<String>()
}

/// `SELECT datetime(base, m1, m2, …)`.
fn sqlite_datetime(base: &str, modifiers: &[&str]) -> Option<String> {
    let sql = format!("SELECT datetime(?1{})", placeholders(2, modifiers.len()));
    let mut params = vec![base.to_string()];
    params.extend(modifiers.iter().map(|m| m.to_string()));
    sqlite_text(&sql, &params)
}

/// Whether a modifier text is `START OF HOUR`, which SQLite lacks.
fn is_start_of_hour(modifier: &str) -> bool {
    modifier
        .split_whitespace()
        .map(str::to_ascii_uppercase)
        .eq(["START", "OF", "HOUR"])
}

/// The reference for a modifier chain that may hold `START OF HOUR`: SQLite's
/// `datetime()` over the modifiers, with `strftime('%Y-%m-%d %H:00:00', …)`
/// applied at each `START OF HOUR`. `base_expr` is an SQL expression over ?1.
fn sqlite_chain(base_expr: &str, base: String, modifiers: &[String]) -> Option<String> {
    let mut expr = base_expr.to_string();
    let mut params = vec![base];
    let mut pending = String::new();
    for modifier in modifiers {
        if is_start_of_hour(modifier) {
            expr = format!("strftime('%Y-%m-%d %H:00:00', datetime({expr}{pending}))");
            pending.clear();
        } else {
            params.push(modifier.clone());
            pending.push_str(&format!(", ?{}", params.len()));
        }
    }
    sqlite_text(&format!("SELECT datetime({expr}{pending})"), &params)
}

/// The next run SQLite gives for one modifier (or `START OF HOUR`) from `base`.
fn reference(base: &str, modifier: &str) -> String {
    let answer = if is_start_of_hour(modifier) {
        sqlite_text(
            "SELECT strftime('%Y-%m-%d %H:00:00', ?1)",
            &[base.to_string()],
        )
    } else {
        sqlite_datetime(base, &[modifier])
    };
    answer.unwrap_or_else(|| panic!("SQLite has no time for {base} {modifier}"))
}

/// What `calendar::apply` answers for modifier texts, as SQLite-style text.
fn apply_texts(base_secs: i64, modifiers: &[String]) -> Option<String> {
    let parsed: Vec<Modifier> = modifiers
        .iter()
        .map(|m| Modifier::parse(m).unwrap_or_else(|| panic!("{m:?} does not parse")))
        .collect();
    calendar::apply(Timestamp(base_secs * 1000), &parsed).map(|t| t.to_string())
}

/// A random spelling of a unit: any case, singular or plural.
fn unit_spelling(unit: &'static str) -> impl Strategy<Value = String> {
    (any::<bool>(), any::<bool>()).prop_map(move |(plural, lower)| {
        let word = if plural {
            format!("{unit}S")
        } else {
            unit.to_string()
        };
        if lower {
            word.to_ascii_lowercase()
        } else {
            word
        }
    })
}

/// `+N UNIT` / `-N UNIT` with up to `digits` digits.
fn shift(unit: &'static str, digits: usize) -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!['+', '-']),
        proptest::string::string_regex(&format!("[0-9]{{1,{digits}}}")).expect("regex"),
        unit_spelling(unit),
    )
        .prop_map(|(sign, number, unit)| format!("{sign}{number} {unit}"))
}

/// Every modifier kind SQLite knows, in SQLite's spelling.
fn sqlite_modifier() -> impl Strategy<Value = String> {
    prop_oneof![
        shift("SECOND", 8),
        shift("MINUTE", 3),
        shift("HOUR", 3),
        shift("DAY", 3),
        shift("MONTH", 3),
        shift("YEAR", 3),
        prop::sample::select(vec![
            "START OF DAY",
            "START OF MONTH",
            "START OF YEAR",
            "start of day",
            "start of month",
            "start of year",
        ])
        .prop_map(str::to_string),
        (0u8..=6).prop_map(|d| format!("WEEKDAY {d}")),
    ]
}

/// As [`sqlite_modifier`], plus `START OF HOUR`.
fn any_modifier() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => sqlite_modifier(),
        1 => prop::sample::select(vec!["START OF HOUR", "start of hour"]).prop_map(str::to_string),
    ]
}

/// Whole seconds from 1970-01-01 to 2200-01-01.
fn base_secs() -> impl Strategy<Value = i64> {
    0i64..=7_258_118_400
}

fn glob_text(chars: &'static [char], max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(chars), 0..max)
        .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn calendar_apply_equals_sqlite_datetime(
        base in base_secs(),
        modifiers in prop::collection::vec(sqlite_modifier(), 1..=5),
    ) {
        let ours = apply_texts(base, &modifiers);
        let sql = format!(
            "SELECT datetime(?1, 'unixepoch'{})",
            placeholders(2, modifiers.len())
        );
        let mut params = vec![base.to_string()];
        params.extend(modifiers.iter().cloned());
        let sqlite = sqlite_text(&sql, &params);
        prop_assert_eq!(ours, sqlite, "base {} modifiers {:?}", base, modifiers);
    }

    #[test]
    fn calendar_apply_with_start_of_hour_equals_sqlite_strftime(
        base in base_secs(),
        modifiers in prop::collection::vec(any_modifier(), 1..=5),
    ) {
        let ours = apply_texts(base, &modifiers);
        let sqlite = sqlite_chain("?1, 'unixepoch'", base.to_string(), &modifiers);
        prop_assert_eq!(ours, sqlite, "base {} modifiers {:?}", base, modifiers);
    }

    #[test]
    fn glob_matches_equals_sqlite_glob(
        pattern in glob_text(&['*', '?', '[', ']', '^', '-', 'a', 'b', 'c', 'A', 'é'], 9),
        text in glob_text(&['a', 'b', 'c', 'A', '-', ']', '[', '^', '*', '?', 'é'], 7),
    ) {
        let sqlite = SQLITE.with(|conn| {
            conn.borrow()
                .query_row("SELECT ?1 GLOB ?2", [&text, &pattern], |row| row.get::<_, bool>(0))
                .expect("GLOB")
        });
        prop_assert_eq!(
            glob_matches(&pattern, &text),
            sqlite,
            "{:?} GLOB {:?}",
            text,
            pattern
        );
    }
}

/// The modifier of each kind the server is checked with.
const MODIFIER_KINDS: [&str; 19] = [
    "+17 SECONDS",
    "-17 SECONDS",
    "+5 MINUTES",
    "-5 MINUTE",
    "+2 HOURS",
    "-2 HOURS",
    "+3 DAYS",
    "-3 DAY",
    "+1 MONTH",
    "-1 MONTHS",
    "+1 YEAR",
    "-2 YEARS",
    "START OF DAY",
    "START OF MONTH",
    "START OF YEAR",
    "START OF HOUR",
    "WEEKDAY 0",
    "WEEKDAY 3",
    "WEEKDAY 6",
];

/// A fixed past first run: 31 January, so month arithmetic overflows as
/// SQLite's does.
const FIRST_RUN: &str = "2020-01-31 10:20:30";

fn now_secs() -> i64 {
    Timestamp::now().whole_second().millis() / 1000
}

fn secs_text(secs: i64) -> String {
    Timestamp(secs * 1000).to_string()
}

/// One run of a repeating job, seen from outside.
struct Run {
    /// QueryJob right after the hand-out.
    running: Value,
    /// QueryJob after the finish.
    finished: Value,
    /// Whole seconds just before and just after the finish call.
    before: i64,
    after: i64,
}

/// Creates one job per repeat (named `{prefix}-{i}`, first run
/// [`FIRST_RUN`]), hands them all out, waits until the clock has moved to a
/// later second than every hand-out, so that the STARTED and FINISHED bases
/// differ, then finishes each.
fn run_all(api: &Api, prefix: &str, repeats: &[String]) -> Vec<Run> {
    let held: Vec<(i64, Value)> = repeats
        .iter()
        .enumerate()
        .map(|(i, repeat)| {
            let name = format!("{prefix}-{i}");
            let id = api.create(json!({"name": name, "repeat": repeat, "firstRun": FIRST_RUN}));
            let handed = api.take(&name);
            assert_eq!(handed["jobID"], id);
            let running = api.job(id);
            assert_eq!(running["state"], "RUNNING");
            assert_eq!(running["repeat"], repeat.to_ascii_uppercase());
            (id, running)
        })
        .collect();
    let last_started = now_secs();
    poll("the clock to pass the hand-outs' second", || {
        (now_secs() > last_started).then_some(())
    });
    held.into_iter()
        .map(|(id, running)| {
            let before = now_secs();
            let (status, answer) = api.post(&format!("/jobs/{id}/finish"), json!({}));
            let after = now_secs();
            assert_eq!(status, 200, "finish: {answer}");
            let finished = api.job(id);
            assert_eq!(finished["state"], "QUEUED", "{finished}");
            Run {
                running,
                finished,
                before,
                after,
            }
        })
        .collect()
}

fn with_base(base: &str, modifiers: &[&str]) -> Vec<String> {
    modifiers.iter().map(|m| format!("{base}, {m}")).collect()
}

#[test]
fn scheduled_repeats_count_from_the_previous_next_run() {
    let server = Server::start();
    let api = server.api();
    let runs = run_all(&api, "sched", &with_base("SCHEDULED", &MODIFIER_KINDS));
    let secs = |text: &str| Timestamp::parse(text).expect("a time").millis() / 1000;
    for (modifier, run) in MODIFIER_KINDS.iter().zip(&runs) {
        let computed = reference(FIRST_RUN, modifier);
        let interval = secs(&computed) - secs(FIRST_RUN);
        if modifier.starts_with('+') && interval < 4 * 3600 {
            // Behind by years, a short fixed interval is re-anchored: the
            // first slot after the finish, on the first run's phase.
            let next = secs(run.finished["nextRun"].as_str().expect("nextRun"));
            assert_eq!((next - secs(FIRST_RUN)) % interval, 0, "{modifier}");
            assert!(
                run.before < next && next <= run.after + interval,
                "SCHEDULED, {modifier}: {} is not the first slot after the finish",
                run.finished["nextRun"]
            );
            continue;
        }
        assert_eq!(
            run.finished["nextRun"], computed,
            "SCHEDULED, {modifier} from {FIRST_RUN}"
        );
    }
}

#[test]
fn started_repeats_count_from_the_last_run() {
    let server = Server::start();
    let api = server.api();
    let runs = run_all(&api, "started", &with_base("STARTED", &MODIFIER_KINDS));
    for (modifier, run) in MODIFIER_KINDS.iter().zip(&runs) {
        let last_run = run.running["lastRun"].as_str().expect("lastRun");
        assert_ne!(last_run, "", "lastRun is set by the hand-out");
        assert_eq!(run.finished["lastRun"], last_run);
        assert!(
            secs_text(run.before).as_str() > last_run,
            "the finish is in a later second than the start"
        );
        assert_eq!(
            run.finished["nextRun"],
            reference(last_run, modifier),
            "STARTED, {modifier} from lastRun {last_run}"
        );
    }
}

/// Asserts `run` finished with the nextRun SQLite gives for `modifiers` from
/// some whole second between just before and just after the finish.
#[track_caller]
fn assert_finished_base(run: &Run, modifiers: &[&str]) {
    let next_run = &run.finished["nextRun"];
    let candidates: Vec<String> = (run.before..=run.after)
        .map(|secs| {
            let mut text = secs_text(secs);
            for modifier in modifiers {
                text = reference(&text, modifier);
            }
            text
        })
        .collect();
    assert!(
        candidates.iter().any(|c| next_run == c),
        "nextRun {next_run} for FINISHED, {modifiers:?} finished between {} and {}: expected one of {candidates:?}",
        secs_text(run.before),
        secs_text(run.after)
    );
}

#[test]
fn finished_repeats_count_from_the_finish() {
    let server = Server::start();
    let api = server.api();
    let runs = run_all(&api, "finished", &with_base("FINISHED", &MODIFIER_KINDS));
    for (modifier, run) in MODIFIER_KINDS.iter().zip(&runs) {
        assert_finished_base(run, &[modifier]);
    }
    // The seed's example chains land where SQLite puts them.
    let chains = [
        "+1 DAY, START OF DAY, +4 HOURS",
        "+1 DAY, WEEKDAY 1, START OF DAY, +6 HOURS",
        "+1 HOUR, START OF HOUR",
        "+1 MONTH, START OF MONTH, -1 DAY",
    ];
    let runs = run_all(&api, "chain", &with_base("FINISHED", &chains));
    for (chain, run) in chains.iter().zip(&runs) {
        let modifiers: Vec<&str> = chain.split(", ").collect();
        assert_finished_base(run, &modifiers);
    }
}

#[test]
fn finished_start_of_period_is_exact() {
    // START OF DAY/MONTH/YEAR after a shift make the FINISHED base exact
    // unless the finish straddles midnight; the bracket covers that.
    let server = Server::start();
    let api = server.api();
    let chains = [
        "+1 DAY, START OF DAY",
        "+1 MONTH, START OF MONTH",
        "+1 YEAR, START OF YEAR",
    ];
    let runs = run_all(&api, "period", &with_base("FINISHED", &chains));
    for (chain, run) in chains.iter().zip(&runs) {
        let next_run = run.finished["nextRun"].as_str().expect("nextRun");
        assert!(
            next_run.ends_with("00:00:00"),
            "{chain} gives midnight: {next_run}"
        );
        let modifiers: Vec<&str> = chain.split(", ").collect();
        assert_finished_base(run, &modifiers);
    }
}

#[test]
fn canned_repeats_are_finished_plus_one_period() {
    let server = Server::start();
    let api = server.api();
    let canned = [
        ("HOURLY", "+1 HOUR"),
        ("DAILY", "+1 DAY"),
        ("WEEKLY", "+7 DAYS"),
        ("daily", "+1 DAY"),
    ];
    let repeats: Vec<String> = canned.iter().map(|(c, _)| c.to_string()).collect();
    let runs = run_all(&api, "canned", &repeats);
    for ((_, modifier), run) in canned.iter().zip(&runs) {
        assert_finished_base(run, &[modifier]);
    }
}

#[test]
fn scheduled_repeat_of_4_hours_or_more_in_the_past_catches_up() {
    let server = Server::start();
    let api = server.api();
    // Shorter intervals are re-anchored instead (tests/integration/bedrock/rules.rs).
    let id = api.create(json!({
        "name": "catch-up",
        "repeat": "SCHEDULED, +4 HOURS",
        "firstRun": "2020-01-01 00:00:00",
    }));
    for expected in ["2020-01-01 04:00:00", "2020-01-01 08:00:00"] {
        // Due at once: the next run is in the past.
        let job = api.take("catch-up");
        assert_eq!(job["jobID"], id);
        let (status, answer) = api.post(&format!("/jobs/{id}/finish"), json!({}));
        assert_eq!(status, 200, "{answer}");
        let after = api.job(id);
        assert_eq!(after["state"], "QUEUED");
        assert_eq!(after["nextRun"], expected);
    }
    let again = api.dequeue(json!({"name": "catch-up"}));
    assert_eq!(again.len(), 1, "still due at once: {again:?}");
}

#[test]
fn repeats_are_stored_upper_cased() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({
        "name": "lower",
        "repeat": "finished, +1 hour, start of hour",
    }));
    assert_eq!(api.job(id)["repeat"], "FINISHED, +1 HOUR, START OF HOUR");

    // UpdateJob too, and a new repeat recomputes nextRun from its base.
    let id = api.create(json!({"name": "lower-update", "firstRun": FIRST_RUN}));
    let (status, answer) = api.patch(
        &format!("/jobs/{id}"),
        json!({"data": {}, "repeat": "scheduled, +2 days"}),
    );
    assert_eq!(status, 200, "{answer}");
    let job = api.job(id);
    assert_eq!(job["repeat"], "SCHEDULED, +2 DAYS");
    assert_eq!(job["nextRun"], reference(FIRST_RUN, "+2 DAYS"));
}

fn job_count(api: &Api) -> usize {
    let (status, answer) = api.get("/jobs?limit=1000");
    assert_eq!(status, 200, "{answer}");
    answer["jobs"].as_array().expect("jobs").len()
}

const MALFORMED_REPEATS: [&str; 9] = [
    "",
    "FINISHED",
    "SOMETIME, +1 HOUR",
    "FINISHED, +1 FORTNIGHT",
    "FINISHED, +1000 DAYS",
    "FINISHED, 1 HOUR",
    "FINISHED, WEEKDAY 7",
    "FINISHED, +1 HOUR; DROP TABLE jobs",
    "FINISHED, localtime",
];

#[test]
fn malformed_repeats_are_refused_and_nothing_is_created() {
    let server = Server::start();
    let api = server.api();
    api.create(json!({"name": "existing"}));
    for repeat in MALFORMED_REPEATS.iter().filter(|r| !r.is_empty()) {
        let before = job_count(&api);
        let answer = api.post("/jobs", json!({"name": "bad-repeat", "repeat": repeat}));
        assert_error(answer, 400, "malformed_repeat");
        // In a batch, the good job beside it is not created either.
        let answer = api.post(
            "/jobs/batch",
            json!({"jobs": [{"name": "good"}, {"name": "bad-repeat", "repeat": repeat}]}),
        );
        assert_error(answer, 400, "malformed_repeat");
        assert_eq!(job_count(&api), before, "after {repeat:?}");
    }
    // The jobs table is still there and intact.
    assert_eq!(job_count(&api), 1);
}

#[test]
fn malformed_repeats_are_refused_by_update_and_leave_the_job_alone() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({
        "name": "keep",
        "data": {"v": 1},
        "repeat": "SCHEDULED, +1 DAY",
        "firstRun": FIRST_RUN,
    }));
    let before = api.job(id);
    for repeat in MALFORMED_REPEATS.iter().filter(|r| !r.is_empty()) {
        let answer = api.patch(
            &format!("/jobs/{id}"),
            json!({"data": {"v": 2}, "repeat": repeat}),
        );
        assert_error(answer, 400, "malformed_repeat");
        assert_eq!(api.job(id), before, "after {repeat:?}");
    }
}

#[test]
fn empty_repeat_on_create_means_no_repeat() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "no-repeat", "repeat": ""}));
    assert_eq!(api.job(id)["repeat"], "");
    // It does not repeat: finishing it deletes it.
    api.take("no-repeat");
    let (status, answer) = api.post(&format!("/jobs/{id}/finish"), json!({}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.state(id), None);
}

/// Modifiers that make short intervals, so that most repeats re-anchor,
/// with now and then one of any kind.
fn short_modifier() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => shift("SECOND", 4),
        3 => shift("MINUTE", 3),
        2 => shift("HOUR", 1),
        1 => any_modifier(),
    ]
}

/// The reference for a `SCHEDULED` repeat's next run, the way Bedrock
/// computes it in SQL: the modifiers applied to the previous run; then, if
/// that is at or before now, the interval (in `strftime('%s')` seconds) is
/// positive and under 4 hours, and every modifier starts with `+` or `-`,
/// the previous run plus `(behind / interval + 1) × interval` seconds.
fn sqlite_scheduled(previous: &str, now: &str, modifiers: &[String]) -> Option<String> {
    let computed = sqlite_chain("?1", previous.to_string(), modifiers)?;
    let number = |sql: &str, params: &[&str]| -> i64 {
        SQLITE.with(|conn| {
            conn.borrow()
                .query_row(sql, rusqlite::params_from_iter(params), |row| {
                    row.get::<_, i64>(0)
                })
                .unwrap_or_else(|e| panic!("SQLite refused {sql:?} with {params:?}: {e}"))
        })
    };
    let seconds = |time: &str| number("SELECT CAST(strftime('%s', ?1) AS INTEGER)", &[time]);
    let missed = number("SELECT ?1 <= ?2", &[&computed, now]) == 1;
    let interval = seconds(&computed) - seconds(previous);
    let fixed = modifiers.iter().all(|m| m.starts_with(['+', '-']));
    if !(missed && fixed && 0 < interval && interval < 4 * 3600) {
        return Some(computed);
    }
    let skip = ((seconds(now) - seconds(previous)) / interval + 1) * interval;
    sqlite_datetime(previous, &[&format!("+{skip} SECONDS")])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn scheduled_next_run_is_reanchored_as_bedrock_computes_it(
        previous_ms in (0i64..=7_258_118_400).prop_map(|s| s * 1000),
        previous_frac in 0i64..1000,
        behind_ms in 0i64..=3 * 86_400_000,
        modifiers in prop::collection::vec(short_modifier(), 1..=3),
    ) {
        let previous = Timestamp(previous_ms + previous_frac);
        let now = previous.plus_millis(behind_ms);
        let repeat = jobmgr::protocol::Repeat::parse(&format!("SCHEDULED, {}", modifiers.join(", ")))
            .expect("a repeat");
        let ours = calendar::next_run(&repeat, previous, None, now).map(|t| t.to_string());
        let reference = sqlite_scheduled(&previous.to_string(), &now.to_string(), &modifiers);
        prop_assert_eq!(ours, reference, "previous {} now {} modifiers {:?}", previous, now, modifiers);
    }
}
