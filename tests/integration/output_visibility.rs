//! Output visibility (issue 20, item 6): a large output's sizes and that
//! it was cut, a failing worker's last stderr line in the supervisor's log
//! and in `failures GROUP`, and a timeout that reads as a timeout.

use serde_json::{Value, json};

use crate::common::{Server, Supervisor, client_command, poll};

fn history(server: &Server, id: i64, format: &str) -> String {
    let (code, out, stderr) = client_command(
        server,
        &["job", "history", &id.to_string(), "--format", format],
    );
    assert_eq!(code, 0, "{stderr}");
    out
}

fn ended(server: &Server, id: i64) -> Value {
    poll("the job to end", || {
        let answer: Value = serde_json::from_str(&history(server, id, "json")).ok()?;
        answer["archived"].is_object().then_some(answer)
    })
}

#[test]
fn a_large_output_is_shown_with_its_sizes_and_said_to_be_cut() {
    let server = Server::start();
    let api = server.api();
    let _supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("big")
        .worker(
            "big",
            "#!/bin/sh\nhead -c 10000000 /dev/zero | tr '\\0' 'x'\necho\necho 'a few words' >&2\necho '{\"done\": true}'\n",
        )
        .start();
    let id = api.create(json!({"name": "big"}));
    let answer = ended(&server, id);
    let attempt = &answer["attempts"][0];
    assert_eq!(attempt["outcome"], "finished", "{attempt}");
    assert_eq!(attempt["stdoutBytes"], 10_000_000 + 1 + 15, "{attempt}");
    assert_eq!(attempt["stderrBytes"], 12, "{attempt}");
    let kept = attempt["stdout"].as_str().unwrap();
    assert!(
        kept.len() <= 4096 && kept.ends_with("{\"done\": true}\n"),
        "{kept:?}"
    );

    let text = history(&server, id, "text");
    assert!(
        text.contains("stdout (9.5 MiB in all, cut: the server kept its head and tail, 4.0 KiB"),
        "{text}"
    );
    assert!(text.contains("stderr (12 bytes):"), "{text}");
    assert!(!text.contains("stderr (12 bytes in all, cut"), "{text}");
}

#[test]
fn a_failures_last_stderr_line_is_in_the_log_and_in_its_failure_group() {
    let server = Server::start();
    let api = server.api();
    let supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("broken")
        .arg("--max-attempts")
        .arg("1")
        .worker(
            "broken",
            "#!/bin/sh\necho 'starting' >&2\nprintf 'cannot open /data/in.csv: \\033[31mNo such file\\n\\n' >&2\nexit 7\n",
        )
        .start();
    let id = api.create(json!({"name": "broken"}));
    poll("the job to fail", || {
        (api.state(id).as_deref() == Some("FAILED")).then_some(())
    });
    // The supervisor's log line says why, escaped.
    // (At debug level the whole stderr is logged too; the warning is the
    // line operators read.)
    let warning = |log: &str| {
        log.lines()
            .find(|l| l.contains(" WARN ") && l.contains("cannot open /data/in.csv"))
            .map(str::to_string)
    };
    let line = poll("the failure's log line", || warning(&supervisor.stderr()));
    assert!(line.contains("exited with 7"), "{line}");
    assert!(!line.contains('\u{1b}'), "the escape is escaped: {line:?}");
    assert!(line.contains("\\u{1b}[31mNo such file"), "{line}");

    // `failures GROUP` shows it next to the id, in text and JSON.
    let (code, text, stderr) = client_command(&server, &["failures", "exit:7", "--format", "text"]);
    assert_eq!(code, 0, "{stderr}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with(&id.to_string()))
        .unwrap_or_else(|| panic!("no row for {id}: {text}"));
    assert!(
        row.contains("broken") && row.contains("cannot open /data/in.csv: \\u{1b}[31mNo such file"),
        "{row}"
    );
    let (_, group) = api.get("/failures/exit:7");
    assert_eq!(group["jobs"][0]["jobID"], id, "{group}");
    assert_eq!(
        group["jobs"][0]["error"], "cannot open /data/in.csv: \\u{1b}[31mNo such file",
        "{group}"
    );
}

#[test]
fn a_timeout_reads_as_a_timeout_in_the_text_history() {
    let server = Server::start();
    let api = server.api();
    let _supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("slow")
        .arg("--max-attempts")
        .arg("1")
        .arg("--timeout")
        .arg("1s")
        .worker("slow", "#!/bin/sh\nexec sleep 60\n")
        .start();
    let id = api.create(json!({"name": "slow"}));
    let answer = ended(&server, id);
    assert_eq!(answer["attempts"][0]["failure"], "timeout", "{answer}");
    let text = history(&server, id, "text");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("no attempt row: {text}"));
    assert!(
        row.contains("timeout (killed by SIG") && row.contains(" after "),
        "{row}"
    );
}
