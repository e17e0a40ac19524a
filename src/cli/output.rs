//! Printing answers: JSON for programs, aligned text for people.

use std::io::IsTerminal;

use serde_json::Value;

/// How to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Readable text.
    Text,
    /// One JSON document.
    Json,
}

impl Format {
    /// The format asked for, else text on a terminal and JSON when piped.
    pub fn choose(asked: Option<Format>) -> Format {
        asked.unwrap_or(if std::io::stdout().is_terminal() {
            Format::Text
        } else {
            Format::Json
        })
    }
}

/// Prints a value as one line of JSON.
pub fn print_value(value: &Value) {
    println!("{value}");
}

/// Prints one job as `key: value` lines, data last and indented.
pub fn print_job(job: &Value) {
    let Some(fields) = job.as_object() else {
        print_value(job);
        return;
    };
    let width = fields.keys().map(String::len).max().unwrap_or(0);
    for (key, value) in fields.iter().filter(|(k, _)| k.as_str() != "data") {
        let shown = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        println!("{key:>width$}: {shown}");
    }
    if let Some(data) = fields.get("data") {
        let pretty = serde_json::to_string_pretty(data).unwrap_or_default();
        println!(
            "{:>width$}: {}",
            "data",
            pretty.replace('\n', &format!("\n{:width$}  ", ""))
        );
    }
    println!();
}

/// Prints jobs as a table.
pub fn print_jobs(jobs: &[Value]) {
    println!(
        "{:>10}  {:<9}  {:>8}  {:<23}  NAME",
        "JOBID", "STATE", "PRIORITY", "NEXT RUN"
    );
    for job in jobs {
        println!(
            "{:>10}  {:<9}  {:>8}  {:<23}  {}",
            job["jobID"].to_string(),
            job["state"].as_str().unwrap_or(""),
            job["priority"].to_string(),
            job["nextRun"].as_str().unwrap_or(""),
            job["name"].as_str().unwrap_or("")
        );
    }
}

/// `n` and the noun for it: "1 job", "2 jobs", "0 jobs".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::count(1, "job", "jobs"), "1 job");
        assert_eq!(super::count(2, "job", "jobs"), "2 jobs");
        assert_eq!(super::count(0, "job", "jobs"), "0 jobs");
    }
}
