//! The site the job storms run beside: Debian's nginx and php-fpm, started
//! by the benchmark with configurations of their own in a temporary
//! directory, in a cgroup v2 directory of their own (so that a supervisor
//! can be pointed at its pressure), and stopped by process group (never by
//! name) when dropped, the cgroup removed after them.

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// php-fpm's children: the pool is static, this many PHP processes.
pub const FPM_CHILDREN: usize = 4;

/// The PHP page: `n` rounds of MD5 over its own output, so its CPU cost is
/// set by the request.
const BURN_PHP: &str = r#"<?php
$n = (int)($_GET['n'] ?? 0);
$h = 'jobmgr';
for ($i = 0; $i < $n; $i++) {
    $h = md5($h);
}
$out = "$h\n";
header('Content-Type: text/plain');
header('Content-Length: ' . strlen($out));
echo $out;
"#;

/// nginx and php-fpm running, with their directory and cgroup.
pub struct Site {
    /// Where nginx listens.
    pub addr: SocketAddr,
    /// The site's cgroup.
    pub cgroup: SiteCgroup,
    nginx: Option<Child>,
    fpm: Option<Child>,
    dir: tempfile::TempDir,
}

/// The binaries a site needs.
pub struct Binaries {
    nginx: PathBuf,
    fpm: PathBuf,
}

impl Binaries {
    /// nginx and php-fpm (Debian names it `php-fpmX.Y`), or why not.
    pub fn find() -> Result<Binaries, String> {
        let dirs: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        let dirs = [PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")]
            .into_iter()
            .chain(dirs);
        let mut nginx = None;
        let mut fpm = None;
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            for name in names {
                if nginx.is_none() && name == "nginx" {
                    nginx = Some(dir.join(&name));
                }
                if fpm.is_none() && name.starts_with("php-fpm") {
                    fpm = Some(dir.join(&name));
                }
            }
        }
        match (nginx, fpm) {
            (Some(nginx), Some(fpm)) => Ok(Binaries { nginx, fpm }),
            _ => {
                Err("nginx and php-fpm are not installed (`apt-get install nginx php-fpm`)".into())
            }
        }
    }

    /// Their versions, as they say them: "nginx 1.22.1 and PHP 8.2.7".
    pub fn versions(&self) -> String {
        let say = |binary: &Path, flag: &str| {
            Command::new(binary)
                .arg(flag)
                .output()
                .map(|o| {
                    let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                    text.push_str(&String::from_utf8_lossy(&o.stderr));
                    text
                })
                .unwrap_or_default()
        };
        let nginx = say(&self.nginx, "-v");
        let nginx = nginx
            .split("nginx/")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("?");
        let php = say(&self.fpm, "-v");
        let php = php
            .strip_prefix("PHP ")
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("?");
        format!("nginx {nginx} and php-fpm {php}")
    }
}

/// A cgroup v2 directory of the site's own, removed when dropped (once
/// empty).
pub struct SiteCgroup {
    /// Its absolute path.
    pub path: PathBuf,
    /// Its path relative to the v2 mount, as `--site-cgroup` takes it.
    pub relative: String,
}

impl SiteCgroup {
    /// `jobmgr-bench-site-<random>` at the top of the v2 tree
    /// (`/sys/fs/cgroup` on pure v2, `/sys/fs/cgroup/unified` on hybrid
    /// machines), or why not.
    pub fn create() -> Result<SiteCgroup, String> {
        let mount = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(PathBuf::from)
            .find(|m| m.join("cgroup.procs").exists() && m.join("cgroup.controllers").exists())
            .ok_or("no cgroup v2 tree")?;
        let letters: String = (0..16)
            .map(|_| (b'a' + rand::random_range(0..26u8)) as char)
            .collect();
        let name = format!("jobmgr-bench-site-{letters}");
        let path = mount.join(&name);
        std::fs::create_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(SiteCgroup {
            path,
            relative: format!("/{name}"),
        })
    }

    /// Microseconds of CPU its processes have used (`cpu.stat`).
    pub fn cpu_usec(&self) -> u64 {
        self.stat("cpu.stat", "usage_usec")
    }

    /// Microseconds some of its tasks have stalled on `resource` ("cpu",
    /// "io", "memory": the `some` total of its pressure file).
    pub fn stalled_usec(&self, resource: &str) -> u64 {
        let text = std::fs::read_to_string(self.path.join(format!("{resource}.pressure")))
            .unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with("some "))
            .and_then(|l| l.rsplit("total=").next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    fn stat(&self, file: &str, key: &str) -> u64 {
        std::fs::read_to_string(self.path.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }

    fn procs(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for SiteCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.procs().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.procs().is_empty() {
            // Its own processes only: the site's, which outlived their
            // process groups' SIGKILL.
            let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!(
                "could not remove the site's cgroup {}: {e}",
                self.path.display()
            );
        }
    }
}

impl Site {
    /// Writes the configurations, makes the cgroup, starts php-fpm and
    /// nginx in it and waits until the page answers; or says why not.
    pub fn start(binaries: &Binaries) -> Result<Site, String> {
        let dir = tempfile::Builder::new()
            .prefix("jobmgr-bench-site-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let d = dir.path();
        // nginx's and php-fpm's workers (www-data, as root) read it.
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod: {e}"))?;
        std::fs::create_dir(d.join("www")).map_err(|e| format!("www: {e}"))?;
        std::fs::write(d.join("www/burn.php"), BURN_PHP).map_err(|e| format!("page: {e}"))?;
        let port = free_port()?;
        let root = nix::unistd::geteuid().is_root();
        std::fs::write(d.join("php-fpm.conf"), fpm_conf(d, root))
            .map_err(|e| format!("php-fpm.conf: {e}"))?;
        std::fs::write(d.join("nginx.conf"), nginx_conf(d, port, root))
            .map_err(|e| format!("nginx.conf: {e}"))?;
        let cgroup = SiteCgroup::create()?;
        let mut site = Site {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            cgroup,
            nginx: None,
            fpm: None,
            dir,
        };
        let d = site.dir.path().to_path_buf();
        let mut fpm = Command::new(&binaries.fpm);
        fpm.arg("--nodaemonize")
            .arg("--fpm-config")
            .arg(d.join("php-fpm.conf"));
        site.fpm = Some(site.spawn(fpm, "php-fpm")?);
        let mut nginx = Command::new(&binaries.nginx);
        nginx
            .arg("-p")
            .arg(&d)
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .arg("-e")
            .arg(d.join("error.log"));
        site.nginx = Some(site.spawn(nginx, "nginx")?);
        site.wait_ready()?;
        Ok(site)
    }

    /// Starts `command` as a process-group leader in the site's cgroup
    /// (it joins it before its exec, so every process it forks is there).
    fn spawn(&self, mut command: Command, what: &str) -> Result<Child, String> {
        let procs = CString::new(
            self.cgroup
                .path
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .map_err(|e| format!("cgroup path: {e}"))?;
        let log = std::fs::File::create(self.dir.path().join(format!("{what}.out")))
            .map_err(|e| format!("{what} log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("{what} log: {e}"))?;
        command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        // SAFETY: between fork and exec this only calls open, write and
        // close (async-signal-safe) on memory prepared before the fork.
        unsafe {
            command.pre_exec(move || {
                let fd = nix::libc::open(procs.as_ptr(), nix::libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                nix::libc::close(fd);
                if written != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command.spawn().map_err(|e| format!("start {what}: {e}"))
    }

    /// Waits up to 15 s for the page to answer 200.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(body) = get(self.addr, "/burn.php?n=1") {
                if body.starts_with("HTTP/1.1 200") {
                    return Ok(());
                }
            }
            let exited = [("php-fpm", &mut self.fpm), ("nginx", &mut self.nginx)]
                .into_iter()
                .find_map(|(what, child)| Some((what, child.as_mut()?.try_wait().ok()??)));
            if let Some((what, status)) = exited {
                return Err(format!("{what} exited ({status}): {}", self.logs()));
            }
            if Instant::now() > deadline {
                return Err(format!("the site did not answer in 15 s: {}", self.logs()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The ends of the logs, for an error.
    fn logs(&self) -> String {
        ["nginx.out", "php-fpm.out", "error.log", "php-fpm.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
                let tail: String = text.chars().rev().take(600).collect::<String>();
                format!("{f}: {}", tail.chars().rev().collect::<String>().trim())
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Drop for Site {
    /// SIGTERM to each process group, SIGKILL to what is left after 5 s;
    /// the cgroup goes (once empty) after.
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        let mut children: Vec<Child> = [self.nginx.take(), self.fpm.take()]
            .into_iter()
            .flatten()
            .collect();
        for child in &children {
            let _ = killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for child in &mut children {
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for child in &mut children {
            // The group's other members (nginx's and php-fpm's workers)
            // may outlive their leader for a moment.
            let _ = killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                Signal::SIGKILL,
            );
            let _ = child.wait();
        }
    }
}

/// A port free on 127.0.0.1 now.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port: {e}"))
}

/// One GET on a connection of its own; the raw answer.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

fn fpm_conf(d: &Path, root: bool) -> String {
    let d = d.display();
    let users = if root {
        "user = www-data\ngroup = www-data\nlisten.owner = www-data\nlisten.group = www-data\n"
    } else {
        ""
    };
    format!(
        "[global]\npid = {d}/php-fpm.pid\nerror_log = {d}/php-fpm.log\ndaemonize = no\n\n\
         [site]\n{users}listen = {d}/php-fpm.sock\nlisten.mode = 0660\nlisten.backlog = 511\n\
         pm = static\npm.max_children = {FPM_CHILDREN}\npm.max_requests = 0\n"
    )
}

fn nginx_conf(d: &Path, port: u16, root: bool) -> String {
    let d = d.display();
    let user = if root { "user www-data;\n" } else { "" };
    format!(
        r#"{user}worker_processes 2;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {d}/access.log combined buffer=64k flush=1s;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port};
        root {d}/www;
        location ~ \.php$ {{
            fastcgi_pass unix:{d}/php-fpm.sock;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_param SCRIPT_NAME $fastcgi_script_name;
            fastcgi_param QUERY_STRING $query_string;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param REQUEST_URI $request_uri;
            fastcgi_param SERVER_PROTOCOL $server_protocol;
            fastcgi_param GATEWAY_INTERFACE CGI/1.1;
            fastcgi_param REMOTE_ADDR $remote_addr;
            fastcgi_param SERVER_NAME $server_name;
            fastcgi_param SERVER_PORT $server_port;
        }}
    }}
}}
"#
    )
}
