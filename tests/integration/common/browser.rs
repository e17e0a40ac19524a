//! A real browser for the dashboard's tests: headless Debian `chromium`
//! driven through `chromedriver` (WebDriver, with the fantoccini crate).
//! [`Browser::start`] answers `None`, after printing why, only when
//! chromium or chromedriver is not installed (`.ci/run` installs both); it
//! starts chromedriver on a free port in a process group of its own and
//! kills that group when dropped. Its methods are blocking, so that tests
//! mix them freely with the blocking [`super::Api`].

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use super::DEADLINE;

/// Where screenshots go: `target/ui-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .join("ui-screenshots")
}

/// An executable on `PATH` (or named by the environment variable `var`).
fn find(var: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(var) {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// A headless chromium session.
pub struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A browser window of 1280×900, or `None` (printed) when chromium or
    /// chromedriver is not installed.
    pub fn start(test: &str) -> Option<Browser> {
        let driver_path = find("JOBMGR_TEST_CHROMEDRIVER", &["chromedriver"]);
        let chromium = find(
            "JOBMGR_TEST_CHROMIUM",
            &["chromium", "chromium-browser", "google-chrome"],
        );
        let (Some(driver_path), Some(chromium)) = (driver_path, chromium) else {
            eprintln!(
                "SKIPPED {test}: the browser tests need chromium and chromedriver \
                 (apt-get install chromium chromium-driver; .ci/run installs them)"
            );
            return None;
        };
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("its address").port()
        };
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver_path.display()));
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut browser = Browser {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
            client: None,
            driver,
            _profile: profile,
        };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < DEADLINE,
                "chromedriver did not listen on port {port} within {DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let capabilities = json!({
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", browser._profile.path().display()),
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let url = format!("http://127.0.0.1:{port}");
        let client = browser.runtime.block_on(async {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            let mut last = None;
            while start.elapsed() < DEADLINE * 2 {
                match ClientBuilder::new(connector.clone())
                    .capabilities(capabilities.clone())
                    .connect(&url)
                    .await
                {
                    Ok(client) => return client,
                    Err(e) => last = Some(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("no chromium session from chromedriver: {last:?}")
        });
        browser.client = Some(client);
        Some(browser)
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a session")
    }

    /// Loads `url` and waits for it.
    pub fn goto(&self, url: &str) {
        self.runtime
            .block_on(self.client().goto(url))
            .unwrap_or_else(|e| panic!("cannot load {url}: {e}"));
    }

    /// The text of the first element matching `css`, if there is one.
    pub fn text(&self, css: &str) -> Option<String> {
        self.runtime.block_on(async {
            let element = self.client().find(Locator::Css(css)).await.ok()?;
            element.text().await.ok()
        })
    }

    /// The texts of every element matching `css`.
    pub fn texts(&self, css: &str) -> Vec<String> {
        self.runtime.block_on(async {
            let mut out = Vec::new();
            for element in self
                .client()
                .find_all(Locator::Css(css))
                .await
                .unwrap_or_default()
            {
                out.push(element.text().await.unwrap_or_default());
            }
            out
        })
    }

    /// A property (such as `textContent`) of the first element matching
    /// `css`, when it is a string.
    pub fn prop(&self, css: &str, name: &str) -> Option<String> {
        self.runtime.block_on(async {
            let element = self.client().find(Locator::Css(css)).await.ok()?;
            element.prop(name).await.ok().flatten()
        })
    }

    /// An attribute of the first element matching `css`, as written in
    /// the page.
    pub fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.runtime.block_on(async {
            let element = self.client().find(Locator::Css(css)).await.ok()?;
            element.attr(name).await.ok().flatten()
        })
    }

    /// Clicks the first element matching `css`.
    pub fn click(&self, css: &str) {
        self.runtime.block_on(async {
            let element = self
                .client()
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("no {css} to click: {e}"));
            element
                .click()
                .await
                .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
        });
    }

    /// Types `text` into the first element matching `css`.
    pub fn fill(&self, css: &str, text: &str) {
        self.runtime.block_on(async {
            let element = self
                .client()
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("no {css} to type into: {e}"));
            element
                .send_keys(text)
                .await
                .unwrap_or_else(|e| panic!("cannot type into {css}: {e}"));
        });
    }

    /// The text of the open alert or confirmation, if one is open.
    pub fn dialog(&self) -> Option<String> {
        self.runtime.block_on(self.client().get_alert_text()).ok()
    }

    /// Waits for a confirmation to open and accepts it; its text.
    pub fn confirm(&self) -> String {
        let text = super::poll("a confirmation dialog", || self.dialog());
        self.runtime
            .block_on(self.client().accept_alert())
            .expect("accept the dialog");
        text
    }

    /// Runs `script` in the page; what it returns.
    pub fn run(&self, script: &str) -> Value {
        self.runtime
            .block_on(self.client().execute(script, vec![]))
            .unwrap_or_else(|e| panic!("script {script:?} failed: {e}"))
    }

    /// The page's URL.
    pub fn url(&self) -> String {
        self.runtime
            .block_on(self.client().current_url())
            .expect("the current URL")
            .to_string()
    }

    /// Resizes the window.
    pub fn size(&self, width: u32, height: u32) {
        self.runtime
            .block_on(self.client().set_window_size(width, height))
            .expect("resize the window");
    }

    /// Saves a screenshot as `target/ui-screenshots/NAME.png`; its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let png = self
            .runtime
            .block_on(self.client().screenshot())
            .expect("a screenshot");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("the screenshot directory");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }

    /// Logs in on `base`'s login form with `token`, and waits for the
    /// overview.
    pub fn log_in(&self, base: &str, token: &str) {
        self.goto(&format!("{base}/ui/login"));
        self.fill("#token", token);
        self.click("form.login button[type=submit]");
        super::poll("the overview after logging in", || {
            (self.text("h1").as_deref() == Some("Overview")).then_some(())
        });
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), client.close()).await
            });
        }
        // chromedriver and what it started: its own process group, led by
        // the child this fixture holds and has not reaped.
        super::process::kill_group(&self.driver);
        if super::process::wait_child(&mut self.driver, DEADLINE).is_none() {
            eprintln!(
                "chromedriver (pid {}) was not reaped {DEADLINE:?} after SIGKILL",
                self.driver.id()
            );
        }
    }
}
