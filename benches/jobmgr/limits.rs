//! The HTTP port under attack, with its default limits: a normal client's
//! latency (QueryJob over a kept-alive connection from its own address)
//! when quiet, while another address floods the port with connections, and
//! while slow uploads hold the body budget; and the server's RSS with 1,024
//! idle connections held.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::json;

use crate::Scale;
use crate::common::{ServerProcess, TOKEN, auth_headers, percentile, post};

fn connect_from(from: IpAddr, server: SocketAddr) -> Option<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::new(from, 0).into()).ok()?;
    socket.connect(&server.into()).ok()?;
    Some(socket.into())
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// p50 and p99 in ms of `samples` QueryJobs.
fn latency(client: &reqwest::blocking::Client, url: &str, id: i64, samples: usize) -> (f64, f64) {
    let mut ms: Vec<f64> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            let response = client
                .get(format!("{url}/jobs/{id}"))
                .send()
                .expect("query");
            assert_eq!(
                response.status().as_u16(),
                200,
                "the normal client was refused"
            );
            let _ = response.bytes();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 0.5), percentile(&ms, 0.99))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The section of the report.
pub fn report(scale: Scale) -> String {
    let server = ServerProcess::start();
    let url = server.url.clone();
    let addr: SocketAddr = url.trim_start_matches("http://").parse().expect("addr");
    let client = reqwest::blocking::Client::builder()
        .local_address(loopback(2))
        .default_headers(auth_headers())
        .build()
        .expect("client");
    let id = post(&client, &format!("{url}/jobs"), &json!({"name": "Probe"}))["jobID"]
        .as_i64()
        .expect("jobID");
    let samples = scale.latency_samples;
    let quiet = latency(&client, &url, id, samples);

    // A flood from 127.0.0.1: 1,000 connections held or refused, and one
    // thread reconnecting as fast as it can.
    let rss_before = rss_kib(server.child.id());
    let held: Vec<TcpStream> = (0..1000)
        .filter_map(|_| connect_from(loopback(1), addr))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut count = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if connect_from(loopback(1), addr).is_some() {
                    count += 1;
                }
            }
            count
        })
    };
    let churn_start = Instant::now();
    let flooded = latency(&client, &url, id, samples);
    stop.store(true, Ordering::Relaxed);
    let churned = churn.join().expect("churn") as f64 / churn_start.elapsed().as_secs_f64();
    drop(held);

    // 1,024 idle connections held, from eight addresses (128 each).
    let idle: Vec<TcpStream> = (3..11)
        .flat_map(|last| (0..128).filter_map(move |_| connect_from(loopback(last), addr)))
        .collect();
    // Let the server take them all in before reading its RSS.
    let probe = latency(&client, &url, id, 10);
    let rss_idle = rss_kib(server.child.id());
    let per_connection = (rss_idle.saturating_sub(rss_before)) as f64 / idle.len() as f64;
    drop(idle);
    let _ = probe;

    // 30 slow uploads of 16 MiB (480 MiB offered to a 256 MiB budget),
    // each holding its connection open with its body unfinished.
    let uploads: Vec<TcpStream> = (0..30)
        .filter_map(|i| {
            let mut stream = connect_from(loopback(20 + (i % 8) as u8), addr)?;
            let head = format!(
                "POST /jobs/batch HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
                 content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).ok()?;
            let chunk = vec![b' '; 256 * 1024];
            for _ in 0..64 {
                let mut piece = format!("{:x}\r\n", chunk.len()).into_bytes();
                piece.extend_from_slice(&chunk);
                piece.extend_from_slice(b"\r\n");
                if stream.write_all(&piece).is_err() {
                    break;
                }
            }
            Some(stream)
        })
        .collect();
    let uploading = latency(&client, &url, id, samples);
    let rss_uploads = rss_kib(server.child.id());
    drop(uploads);

    let mut out = String::new();
    out.push_str("## The HTTP port under attack (default limits)\n\n");
    out.push_str(&format!(
        "A normal client (its own address, kept-alive connection) queries a job {samples} times in each condition; latency in ms.\n\n"
    ));
    out.push_str("| condition | p50 | p99 |\n|---|---|---|\n");
    for (name, (p50, p99)) in [
        ("quiet", quiet),
        (
            "1,000 connections from one address held or refused, plus one thread reconnecting in a loop",
            flooded,
        ),
        (
            "30 slow 16 MiB uploads holding the 256 MiB body budget",
            uploading,
        ),
    ] {
        out.push_str(&format!("| {name} | {p50:.2} | {p99:.2} |\n"));
    }
    out.push_str(&format!(
        "\n- Reconnections refused or held per second during the flood: {churned:.0}.\n\
         - Server RSS: {:.1} MiB before the flood, {:.1} MiB with 1,024 idle connections held \
         ({per_connection:.1} KiB each), {:.1} MiB with the 30 uploads held.\n\n",
        rss_before as f64 / 1024.0,
        rss_idle as f64 / 1024.0,
        rss_uploads as f64 / 1024.0,
    ));
    out
}
