//! Answers within the server's byte budget, tried as an attacker would
//! against the real server binary: a dequeue or a Bedrock GetJobs that asks
//! for 1,000 jobs of 900 KiB each, and a tracked list of such jobs. A
//! hand-out is cut at 8 MiB of jobs (at least one job), and further while
//! other clients hold the budget; the jobs cut stay queued as they were and
//! the next request hands them out: nothing lost, nothing twice. The
//! server's peak RSS stays within its budget.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::{Value, json};

use crate::common::bedrock_conn::Conn;
use crate::common::*;

/// An encoded answer of 8 MiB of jobs, with room for its other fields.
const PAGE_BOUND: usize = 9 << 20;

/// Creates `count` jobs `Big0`, `Big1`, … of about 900 KiB of data each,
/// one request at a time (no batch: its parsed form would raise the
/// server's peak RSS before it is measured).
fn big_jobs(api: &Api, count: usize) -> Vec<i64> {
    let blob = "x".repeat(900 * 1024);
    (0..count)
        .map(|i| api.create(json!({"name": format!("Big{i}"), "data": {"blob": blob}})))
        .collect()
}

/// Whether job `id` is queued as if never handed out.
fn untouched(api: &Api, id: i64) -> bool {
    let job = api.job(id);
    job["state"] == "QUEUED" && job["attempts"] == 0
}

/// Dequeues up to 1,000 `Big*` jobs, asking again while the server is busy;
/// checks that the answer is within a page.
fn dequeue_many(api: &Api) -> Vec<Value> {
    let (status, answer) = poll("a dequeue within the budget", || {
        let (status, answer) = api.post("/dequeue", json!({"name": "Big*", "numResults": 1000}));
        (status != 503).then_some((status, answer))
    });
    assert_eq!(status, 200, "{answer}");
    let encoded = answer.to_string().len();
    assert!(encoded < PAGE_BOUND, "a hand-out of {encoded} bytes");
    answer["jobs"].as_array().expect("jobs").clone()
}

fn ids_of(jobs: &[Value]) -> Vec<i64> {
    jobs.iter()
        .map(|job| job["jobID"].as_i64().expect("jobID"))
        .collect()
}

#[test]
fn a_dequeue_of_many_big_jobs_is_cut_within_the_byte_budget_and_the_rest_stays_queued() {
    let server = Server::builder()
        .arg("--http-body-budget")
        .arg("64MiB")
        .start();
    let api = server.api();
    // 100 jobs of 900 KiB: 88 MiB of data, asked for at once.
    let ids = big_jobs(&api, 100);
    let pid = server.pid();
    let baseline = status_kib(pid, "VmHWM");

    let first = dequeue_many(&api);
    let handed = first.len();
    assert!(
        (1..12).contains(&handed),
        "one answer holds at most 8 MiB of jobs, not {handed} of 900 KiB"
    );
    assert_eq!(ids_of(&first), ids[..handed], "the best jobs first");
    assert!(first.iter().all(|job| job["attempt"] == 1), "{first:?}");
    // The jobs cut were never handed out: queued, no attempt counted.
    for id in [ids[handed], ids[handed + 1], ids[99]] {
        assert!(untouched(&api, id), "job {id}: {}", api.job(id));
    }

    // Three clients take the rest at once, each asking for everything:
    // every job is handed out once, on its first attempt.
    let takers: Vec<_> = (0..3)
        .map(|_| {
            let api = api.clone();
            std::thread::spawn(move || {
                let mut taken = Vec::new();
                loop {
                    let jobs = dequeue_many(&api);
                    if jobs.is_empty() {
                        return taken;
                    }
                    taken.extend(jobs);
                }
            })
        })
        .collect();
    let mut all = first;
    for taker in takers {
        all.extend(taker.join().expect("taker"));
    }
    assert!(
        all.iter().all(|job| job["attempt"] == 1),
        "no attempt counted twice"
    );
    let mut seen = ids_of(&all);
    seen.sort_unstable();
    assert_eq!(seen, ids, "every job handed out once");
    // Asking for 88 MiB held at most what the budget allows.
    assert_peak_rss_within(pid, baseline, 64 + 96, "dequeues of 100 jobs of 900 KiB");
}

#[test]
fn a_dequeue_of_small_jobs_is_not_cut() {
    let server = Server::start();
    let api = server.api();
    let jobs: Vec<Value> = (0..300)
        .map(|i| json!({"name": format!("Small{i}")}))
        .collect();
    let ids = api.create_batch(jobs);
    let handed = api.dequeue(json!({"name": "Small*", "numResults": 1000}));
    assert_eq!(ids_of(&handed), ids);
}

/// Opens an upload to `/jobs/batch` that declares `bytes` and sends none of
/// them, holding that much of the budget (beyond its free 64 KiB), and
/// waits until a listing (a page reserve of 24 MiB) is refused.
fn hold_budget(server: &Server, bytes: usize) -> TcpStream {
    let upload = || {
        let mut holder = TcpStream::connect(server.addr()).expect("connect");
        holder
            .write_all(
                format!(
                    "POST /jobs/batch HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
                     content-type: application/json\r\ncontent-length: {bytes}\r\n\r\n",
                    token(),
                )
                .as_bytes(),
            )
            .expect("head");
        holder.set_nonblocking(true).expect("a non-blocking holder");
        holder
    };
    let mut holder = upload();
    // A listing that came first holds the budget itself, and the upload is
    // answered 503: it is sent again.
    poll("the upload to hold the budget", || {
        if server.api().get("/jobs").0 == 503 {
            return Some(());
        }
        let mut said = [0u8; 512];
        match holder.read(&mut said) {
            Ok(n) if String::from_utf8_lossy(&said[..n]).contains("\"server_busy\"") => {
                holder = upload();
                None
            }
            Ok(n) => panic!(
                "the server answered the upload instead of holding it: {:?}",
                String::from_utf8_lossy(&said[..n])
            ),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => panic!("the upload's connection failed: {e}"),
        }
    });
    holder
}

#[test]
fn a_hand_out_with_no_room_in_the_byte_budget_is_refused_and_takes_nothing() {
    let server = Server::builder()
        .arg("--http-body-budget")
        .arg("24MiB")
        .arg("--http-body-timeout")
        .arg("5m")
        .start();
    let api = server.api();
    let ids = big_jobs(&api, 2);
    // All but 1 MiB of the budget held: one job of 900 KiB needs more.
    let holder = hold_budget(&server, 23 * 1024 * 1024 + 64 * 1024);
    let (status, answer) = api.post("/dequeue", json!({"name": "Big*", "numResults": 10}));
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["code"], "server_busy", "{answer}");
    let mut conn = Conn::open(&server.bedrock);
    let response = conn.call(&with_token_header(
        b"GetJobs\r\nname: Big*\r\nnumResults: 10\r\n\r\n",
    ));
    assert!(
        response.status.starts_with("503 Server busy"),
        "{}",
        response.status
    );
    for id in &ids {
        assert!(untouched(&api, *id), "job {id}: {}", api.job(*id));
    }
    // A request that hands out nothing is still served.
    assert!(api.dequeue(json!({"name": "Other"})).is_empty());

    // Once the budget is free, the jobs are handed out, on their first
    // attempt; the connection that was told busy is still open.
    drop(holder);
    let jobs = dequeue_many(&api);
    assert_eq!(ids_of(&jobs), ids);
    assert!(jobs.iter().all(|job| job["attempt"] == 1), "{jobs:?}");
    let response = conn.call(&with_token_header(b"GetJob\r\nname: Big*\r\n\r\n"));
    assert!(response.status.starts_with("404"), "{}", response.status);
}

#[test]
fn a_bedrock_getjobs_of_many_big_jobs_is_cut_within_the_byte_budget_and_the_rest_stays_queued() {
    let server = Server::builder()
        .arg("--http-body-budget")
        .arg("64MiB")
        .start();
    let api = server.api();
    let ids = big_jobs(&api, 100);
    let pid = server.pid();
    let baseline = status_kib(pid, "VmHWM");
    let mut conn = Conn::open(&server.bedrock);
    let request = with_token_header(b"GetJobs\r\nname: Big*\r\nnumResults: 1000\r\n\r\n");
    let mut all: Vec<i64> = Vec::new();
    let mut answers = 0;
    loop {
        let response = conn.call(&request);
        if response.status.starts_with("404") {
            break;
        }
        response.assert_ok();
        assert!(
            response.body.len() < PAGE_BOUND,
            "a GetJobs answer of {} bytes",
            response.body.len()
        );
        let jobs = ids_of(response.json()["jobs"].as_array().expect("jobs"));
        assert!(!jobs.is_empty());
        if answers == 0 {
            // The jobs cut were never handed out: queued, no attempt.
            let next = ids[jobs.len()];
            assert!(untouched(&api, next), "job {next}: {}", api.job(next));
        }
        answers += 1;
        all.extend(jobs);
    }
    assert_eq!(all, ids, "every job handed out once, in order");
    assert!(answers >= 9, "88 MiB of jobs came in {answers} answers");
    assert_peak_rss_within(pid, baseline, 64 + 48, "GetJobs of 100 jobs of 900 KiB");
}

#[test]
fn a_tracked_list_of_big_jobs_is_paged_under_8_mib() {
    let server = Server::start();
    let api = server.api();
    let ids = big_jobs(&api, 24);
    for id in &ids {
        let (status, answer) = api.post(&format!("/jobs/{id}/track"), json!({}));
        assert_eq!(status, 200, "{answer}");
    }
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut after = 0i64;
    loop {
        let (status, page) = api.get(&format!("/tracked?limit=1000&after={after}"));
        assert_eq!(status, 200, "{page}");
        let encoded = page.to_string().len();
        assert!(encoded < PAGE_BOUND, "a page of {encoded} bytes");
        pages += 1;
        seen.extend(ids_of(page["jobs"].as_array().expect("jobs")));
        match page["nextAfter"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(seen, ids, "paging saw every job once, in order");
    assert!(pages >= 3, "21 MiB of jobs came in {pages} pages");
    // The twin: a page within the bound is whole and says nothing.
    let (_, small) = api.get("/tracked?limit=2");
    assert_eq!(ids_of(small["jobs"].as_array().expect("jobs")), ids[..2]);
    assert!(small.get("nextAfter").is_none(), "{small}");
    // Ids are distinct: nothing twice.
    assert_eq!(seen.iter().collect::<BTreeSet<_>>().len(), ids.len());
}

/// A job whose answer alone outgrows a page (a parent resumed with the
/// data of its finished children) is still handed out, alone, by an idle
/// server of the smallest budget: drawing all its answer costs would never
/// fit, so it was put back at every claim, and every job behind it waited.
#[test]
fn a_parent_whose_childrens_data_outgrow_a_page_is_still_handed_out() {
    let server = Server::builder()
        .arg("--http-body-budget")
        .arg("24MiB")
        .start();
    let api = server.api();
    let parent = api.create(json!({"name": "Parent"}));
    assert_eq!(api.take("Parent")["jobID"], parent);
    let blob = "x".repeat(900 * 1024);
    let children: Vec<i64> = (0..12)
        .map(|i| {
            api.create(
                json!({"name": "Child", "parentJobID": parent, "data": {"blob": blob, "i": i}}),
            )
        })
        .collect();
    let (status, answer) = api.post(&format!("/jobs/{parent}/finish"), json!({}));
    assert_eq!(status, 200, "{answer}");
    for _ in &children {
        let child = api.take("Child");
        let (status, answer) = api.post(&format!("/jobs/{}/finish", child["jobID"]), json!({}));
        assert_eq!(status, 200, "{answer}");
    }
    poll("the parent to be queued again", || {
        (api.state(parent).as_deref() == Some("QUEUED")).then_some(())
    });
    let behind = api.create(json!({"name": "Parent-behind", "priority": 0}));

    let (status, answer) = api.post("/dequeue", json!({"name": "Parent*", "numResults": 10}));
    assert_eq!(status, 200, "{answer}");
    let jobs = answer["jobs"].as_array().expect("jobs").clone();
    assert_eq!(ids_of(&jobs), [parent], "the parent, alone");
    assert!(
        answer.to_string().len() > PAGE_BOUND,
        "its answer outgrows a page"
    );
    assert_eq!(api.take("Parent-behind")["jobID"], behind);
}
