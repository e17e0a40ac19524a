//! TLS on the HTTP port: a server started with `--tls-cert`/`--tls-key`
//! (a certificate for 127.0.0.1 signed by a private CA made with rcgen)
//! serves `https://` to the CLI and a supervisor that trust the CA; a
//! client that does not trust it, and plain HTTP, are refused cleanly; bad
//! certificate or key files are a clear start error.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::common::*;

/// A private CA and a server certificate for 127.0.0.1 it signed, as PEM
/// files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "jobmgr test CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA cert");
        let key = rcgen::KeyPair::generate().expect("server key");
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server params");
        let cert = params.signed_by(&key, &ca).expect("server cert");
        std::fs::write(dir.path().join("server.pem"), cert.pem()).expect("write cert");
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).expect("write key");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write CA");
        Pki {
            ca_pem: ca.pem(),
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn server(&self) -> Server {
        Server::builder()
            .arg("--tls-cert")
            .arg(self.path("server.pem").to_str().expect("path"))
            .arg("--tls-key")
            .arg(self.path("server.key").to_str().expect("path"))
            .start()
    }
}

fn job_cli(server: &Server, ca: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(bin());
    command
        .arg("job")
        .args(args)
        .arg("--server")
        .arg(&server.url)
        .arg("--format")
        .arg("json")
        .arg("--token-file")
        .arg(server.token_file())
        .env_remove("JOBMGR_TOKEN")
        .env_remove("JOBMGR_CA_CERT");
    if let Some(ca) = ca {
        command.arg("--ca-cert").arg(ca);
    }
    let output = command.run_bounded(&format!("jobmgr job {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_cli_creates_and_dequeues_over_https_with_the_ca_and_is_refused_without_it() {
    let pki = Pki::new();
    let server = pki.server();
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let ca = pki.path("ca.pem");
    let (code, out, err) = job_cli(&server, Some(&ca), &["create", "OverTls"]);
    assert_eq!(code, 0, "create over https: {out}{err}");
    let (code, out, err) = job_cli(&server, Some(&ca), &["take", "OverTls"]);
    assert_eq!(code, 0, "dequeue over https: {out}{err}");
    assert!(out.contains("OverTls"), "the job was handed out: {out}");
    // The hostile twin: a client that does not trust the CA is refused.
    let (code, out, err) = job_cli(&server, None, &["create", "Untrusted"]);
    assert_ne!(code, 0, "a client without the CA connected: {out}");
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("cannot reach"),
        "{err}"
    );
    let api = Api::trusting(&server.url, pki.ca_pem.as_bytes());
    let (status, page) = api.get("/jobs");
    assert_eq!(status, 200);
    let names: Vec<&str> = page["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["OverTls"]);
}

#[test]
fn a_supervisor_runs_jobs_from_an_https_server() {
    let pki = Pki::new();
    let server = pki.server();
    let api = Api::trusting(&server.url, pki.ca_pem.as_bytes());
    let sup = Supervisor::builder(&server.url)
        .arg("--ca-cert")
        .arg(pki.path("ca.pem").to_str().expect("path"))
        .worker("Secure", &sh("cat > /dev/null\necho done"))
        .start();
    let id = api.create(json!({"name": "Secure"}));
    wait_for("the job to be finished and deleted", &sup, || {
        api.state(id).is_none().then_some(())
    });
    assert_eq!(api.outcomes(id), ["finished"]);
}

#[test]
fn plain_http_to_the_tls_port_fails_cleanly_and_https_still_works() {
    let pki = Pki::new();
    let server = pki.server();
    let plain = format!("http://{}", server.addr());
    let client = reqwest::blocking::Client::builder()
        .timeout(DEADLINE)
        .build()
        .expect("client");
    let error = client
        .get(format!("{plain}/healthz"))
        .send()
        .expect_err("plain HTTP to a TLS port must fail");
    assert!(
        !error.is_timeout(),
        "plain HTTP hung until timeout: {error}"
    );
    let api = Api::trusting(&server.url, pki.ca_pem.as_bytes());
    assert_eq!(api.get("/healthz").0, 200);
}

#[test]
fn bad_certificate_or_key_files_are_a_clear_start_error() {
    let pki = Pki::new();
    let missing = pki.path("missing.pem");
    let not_pem = pki.path("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").expect("write");
    let cert = pki.path("server.pem");
    let key = pki.path("server.key");
    let ca = pki.path("ca.pem");
    for (cert, key, expect) in [
        (&missing, &key, "missing.pem"),
        (&not_pem, &key, "not.pem"),
        (&cert, &missing, "missing.pem"),
        // A certificate with a key that is not its own.
        (&ca, &key, "cannot be used together"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = jobmgr_in(dir.path())
            .arg("server")
            .arg("--db")
            .arg(dir.path().join("jobs.db"))
            .arg("--http")
            .arg("127.0.0.1:0")
            .arg("--bedrock")
            .arg("none")
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .run_bounded("jobmgr server with bad TLS files");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "started with {cert:?} {key:?}");
        assert!(stderr.contains(expect), "{cert:?} {key:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("ready"),
            "a server with bad TLS files said it was ready"
        );
    }
}
