//! The dashboard at `/ui`: its login and CSRF checks over plain HTTP, then
//! in a real browser (headless chromium through chromedriver, see
//! `common/browser.rs`): every page loads, a job created through the API
//! appears without a reload, a running job's progress bar moves, retrying
//! a failure group runs its job again, and hostile names, data and output
//! show as text. Screenshots go to `target/ui-screenshots/`.

use crate::common::browser::Browser;
use crate::common::*;

use std::time::Duration;

use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

const HOSTILE: &str = "<script>alert(1)</script>";

/// A client that shows redirects instead of following them.
fn client() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Logs in with the form; the session cookie (`name=value`).
pub(crate) fn log_in(base: &str, token: &str) -> Response {
    client()
        .post(format!("{base}/ui/login"))
        .form(&[("token", token)])
        .send()
        .expect("POST /ui/login")
}

pub(crate) fn cookie_of(response: &Response) -> String {
    let set = response
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .expect("a Set-Cookie")
        .to_str()
        .expect("text");
    set.split(';').next().expect("name=value").to_string()
}

/// The CSRF token in a page's forms.
pub(crate) fn csrf_in(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[start..start + 64].to_string()
}

pub(crate) fn get(base: &str, path: &str, cookie: Option<&str>) -> (u16, String) {
    let mut request = client().get(format!("{base}{path}"));
    if let Some(cookie) = cookie {
        request = request.header(reqwest::header::COOKIE, cookie);
    }
    let response = request.send().expect("GET");
    (response.status().as_u16(), response.text().expect("body"))
}

pub(crate) fn post_form(
    base: &str,
    path: &str,
    cookie: Option<&str>,
    form: &[(&str, &str)],
) -> Response {
    let mut request = client().post(format!("{base}{path}")).form(form);
    if let Some(cookie) = cookie {
        request = request.header(reqwest::header::COOKIE, cookie);
    }
    request.send().expect("POST")
}

#[test]
fn the_dashboard_needs_a_login_and_csrf_and_a_get_changes_nothing() {
    let server = Server::start();
    let api = server.api();
    let base = server.url.as_str();
    let id = api.create(json!({"name": "Plain"}));
    let page = format!("/ui/jobs/{id}");

    // No session: the login form, answered 401; the API's bearer token
    // is not a session.
    let (status, body) = get(base, "/ui", None);
    assert_eq!(status, 401);
    assert!(body.contains("name=\"token\""), "{body}");
    let bearer = client()
        .get(format!("{base}{page}"))
        .bearer_auth(token())
        .send()
        .expect("GET");
    assert_eq!(bearer.status().as_u16(), 401);

    // A wrong token is refused (and pauses logins from this address, see
    // ui_login.rs); once the pause is over, the right one gives a strict
    // cookie.
    let wrong = log_in(base, "not-the-token");
    assert_eq!(wrong.status().as_u16(), 401);
    assert!(wrong.headers().get(reqwest::header::SET_COOKIE).is_none());
    let answer = poll("a login once the pause is over", || {
        let answer = log_in(base, token());
        if answer.status().as_u16() == 429 {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        Some(answer)
    });
    assert_eq!(answer.status().as_u16(), 303);
    let set = answer.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .expect("text")
        .to_string();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set.contains(part), "{set}");
    }
    let cookie = cookie_of(&answer);
    let (status, body) = get(base, &page, Some(&cookie));
    assert_eq!(status, 200, "{body}");
    let csrf = csrf_in(&body);

    // Actions: without the CSRF token, with a wrong one or one of another
    // session, without the cookie, as JSON, or from another site: refused,
    // and nothing changes.
    let action = format!("{page}/priority");
    let other_session = cookie_of(&log_in(base, token()));
    let (_, other_page) = get(base, &page, Some(&other_session));
    let other_csrf = csrf_in(&other_page);
    assert_ne!(other_csrf, csrf);
    for (form, cookie, status) in [
        (vec![("priority", "1000")], Some(cookie.as_str()), 403),
        (
            vec![("priority", "1000"), ("csrf", "0000")],
            Some(cookie.as_str()),
            403,
        ),
        (
            vec![("priority", "1000"), ("csrf", other_csrf.as_str())],
            Some(cookie.as_str()),
            403,
        ),
        (
            vec![("priority", "1000"), ("csrf", csrf.as_str())],
            None,
            401,
        ),
    ] {
        let answer = post_form(base, &action, cookie, &form);
        assert_eq!(answer.status().as_u16(), status, "{form:?}");
    }
    let json_body = client()
        .post(format!("{base}{action}"))
        .header(reqwest::header::COOKIE, &cookie)
        .json(&json!({"priority": 1000, "csrf": csrf}))
        .send()
        .expect("POST");
    assert_eq!(json_body.status().as_u16(), 415);
    let foreign = client()
        .post(format!("{base}{action}"))
        .header(reqwest::header::COOKIE, &cookie)
        .header(reqwest::header::ORIGIN, "http://evil.example")
        .form(&[("priority", "1000"), ("csrf", csrf.as_str())])
        .send()
        .expect("POST");
    assert_eq!(foreign.status().as_u16(), 403);
    for path in [format!("{page}/delete"), format!("{page}/priority")] {
        let (status, _) = get(base, &path, Some(&cookie));
        assert_eq!(status, 405, "GET {path}");
    }
    assert_eq!(api.job(id)["priority"], 500);
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));

    // With both: done, and back to the job's page.
    let done = post_form(
        base,
        &action,
        Some(&cookie),
        &[("priority", "1000"), ("csrf", &csrf)],
    );
    assert_eq!(done.status().as_u16(), 303);
    let location = done.headers()[reqwest::header::LOCATION]
        .to_str()
        .expect("text");
    assert!(location.starts_with(&page), "{location}");
    assert_eq!(api.job(id)["priority"], 1000);

    // Logging out drops the cookie.
    let out = post_form(base, "/ui/logout", Some(&cookie), &[("csrf", &csrf)]);
    assert_eq!(out.status().as_u16(), 303);
    let cleared = out.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .expect("text");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
}

/// Waits until the page's heading is `title`.
fn heading(browser: &Browser, title: &str) {
    poll(&format!("the heading {title:?}"), || {
        (browser.text("h1").as_deref() == Some(title)).then_some(())
    });
}

/// The scripts the page runs: only the dashboard's two files, and no alert
/// open.
fn assert_nothing_injected(browser: &Browser, what: &str) {
    assert_eq!(browser.dialog(), None, "{what}: an alert opened");
    let scripts = browser.run(
        "return Array.from(document.querySelectorAll('script:not([type=\"application/json\"])')).map(s => s.src)",
    );
    let scripts = scripts.as_array().expect("a list").clone();
    assert_eq!(scripts.len(), 2, "{what}: scripts {scripts:?}");
    assert!(
        scripts
            .iter()
            .all(|s| s.as_str().unwrap_or("").contains("/ui/assets/")),
        "{what}: {scripts:?}"
    );
    let images = browser.run("return document.querySelectorAll('img').length");
    assert_eq!(images, json!(0), "{what}: an element from data");
}

#[test]
fn every_page_loads_and_a_new_job_appears_without_a_reload() {
    let Some(browser) = Browser::start("every_page_loads_and_a_new_job_appears_without_a_reload")
    else {
        return;
    };
    let sup = Supervisor::embedded()
        .worker("Echo", "#!/bin/sh\necho ok\n")
        .start();
    let api = sup.api();
    let base = sup.ready_field("http");
    let first = api.create(json!({"name": "Echo", "data": {"n": 1}}));
    api.create(json!({"name": "Echo", "data": {"n": 2}}));
    poll("the Echo jobs to finish", || {
        (api.outcomes(first).iter().any(|o| o == "finished")).then_some(())
    });
    let later =
        api.create(json!({"name": "Later", "data": {"x": 1}, "firstRun": "2099-01-01 00:00:00"}));

    // Before logging in: the login form.
    browser.goto(&format!("{base}/ui"));
    heading(&browser, "Log in");
    browser.log_in(&base, token());

    for (path, title, shot) in [
        ("/ui".to_string(), "Overview", "overview"),
        ("/ui/jobs".to_string(), "Jobs", "jobs"),
        (format!("/ui/jobs/{later}"), &*format!("Job {later}"), "job"),
        (
            format!("/ui/jobs/{first}"),
            &*format!("Job {first}"),
            "job-finished",
        ),
        ("/ui/running".to_string(), "Running now", "running"),
        ("/ui/failures".to_string(), "Failures", "failures"),
        ("/ui/supervisors".to_string(), "Supervisors", "supervisors"),
        ("/ui/stats".to_string(), "Statistics", "stats"),
        (
            "/ui/stats?period=day&name=Echo".to_string(),
            "Statistics",
            "stats-day",
        ),
    ] {
        browser.goto(&format!("{base}{path}"));
        heading(&browser, title);
        assert_eq!(browser.text(".error"), None, "{path}: an error");
        assert!(browser.text("#live").is_some(), "{path}: no live part");
        browser.screenshot(shot);
    }

    // The charts are drawn by the vendored Chart.js.
    browser.goto(&format!("{base}/ui"));
    heading(&browser, "Overview");
    poll("a chart on the overview", || {
        let drawn = browser.run(
            "return typeof Chart !== 'undefined' && !!Chart.getChart(document.querySelector('canvas[data-chart]'))",
        );
        (drawn == json!(true)).then_some(())
    });
    let tiles = browser.text("#live").unwrap_or_default();
    let tiles = tiles.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(tiles.contains("1 supervisors online"), "{tiles}");
    browser.screenshot("overview");

    // A job created through the API appears in the list, the page not
    // reloaded (a mark left on it stays).
    browser.goto(&format!("{base}/ui/jobs?name=Fresh*"));
    heading(&browser, "Jobs");
    browser.run("window.notReloaded = true; return null");
    assert!(
        !browser
            .texts("#live td.name")
            .contains(&"FreshJob".to_string())
    );
    let fresh = api.create(json!({"name": "FreshJob", "firstRun": "2099-01-01 00:00:00"}));
    poll("the new job in the list", || {
        browser
            .texts("#live td.name")
            .contains(&"FreshJob".to_string())
            .then_some(())
    });
    assert_eq!(
        browser.run("return window.notReloaded === true"),
        json!(true)
    );
    assert!(
        browser
            .text("#live")
            .unwrap_or_default()
            .contains(&fresh.to_string())
    );

    // At phone width nothing but the tables scrolls sideways.
    browser.size(390, 844);
    browser.goto(&format!("{base}/ui"));
    heading(&browser, "Overview");
    let overflow = browser
        .run("return document.documentElement.scrollWidth - document.documentElement.clientWidth");
    assert!(
        overflow.as_i64().unwrap_or(1) <= 0,
        "sideways scroll {overflow}"
    );
    browser.screenshot("overview-phone");
}

#[test]
fn a_running_jobs_progress_bar_moves() {
    let Some(browser) = Browser::start("a_running_jobs_progress_bar_moves") else {
        return;
    };
    let steps = tempfile::tempdir().expect("temp dir");
    let o = steps.path().display();
    let sup = Supervisor::embedded()
        .worker(
            "Steps",
            &format!(
                "#!/bin/bash\n\
                 echo '{{\"progress\": 25}}' >&\"$JOBMGR_PROGRESS_FD\"\n\
                 while [ ! -e '{o}/two' ]; do sleep 0.05; done\n\
                 echo '{{\"progress\": {{\"done\": 3, \"total\": 4}}}}' >&\"$JOBMGR_PROGRESS_FD\"\n\
                 while [ ! -e '{o}/end' ]; do sleep 0.05; done\n"
            ),
        )
        .start();
    let api = sup.api();
    let base = sup.ready_field("http");
    browser.log_in(&base, token());
    let id = api.create(json!({"name": "Steps"}));
    browser.goto(&format!("{base}/ui/jobs/{id}"));
    heading(&browser, &format!("Job {id}"));
    browser.run("window.notReloaded = true; return null");
    let value = |b: &Browser| b.attr("#progress", "value");
    poll("the job's progress at 25", || {
        (api.job(id)["data"]["progress"] == json!(25)).then_some(())
    });
    poll("the progress bar at 25 %", || {
        (value(&browser).as_deref() == Some("25")).then_some(())
    });
    assert_eq!(browser.text("#job-state").as_deref(), Some("RUNNING"));
    browser.screenshot("job-progress");
    std::fs::write(steps.path().join("two"), "").expect("step");
    poll("the progress bar at 75 %", || {
        (value(&browser).as_deref() == Some("75")).then_some(())
    });
    assert_eq!(
        browser.run("return window.notReloaded === true"),
        json!(true)
    );

    // Running now shows it with its supervisor, elapsed time and progress.
    browser.goto(&format!("{base}/ui/running"));
    heading(&browser, "Running now");
    let row = poll("the job on the running page", || {
        browser
            .text("#live tbody tr")
            .filter(|t| t.contains("Steps"))
    });
    let supervisor = api.get("/workers").1["workers"][0]["id"]
        .as_str()
        .expect("a supervisor")
        .to_string();
    assert!(row.contains(&supervisor), "{row}");
    assert!(row.contains("75%"), "{row}");
    assert_eq!(
        browser.attr("#live progress", "value").as_deref(),
        Some("75")
    );
    browser.screenshot("running");
    std::fs::write(steps.path().join("end"), "").expect("end");
    poll("the job to finish", || {
        api.outcomes(id)
            .iter()
            .any(|o| o == "finished")
            .then_some(())
    });
}

#[test]
fn retrying_a_failure_group_runs_its_job_again() {
    let Some(browser) = Browser::start("retrying_a_failure_group_runs_its_job_again") else {
        return;
    };
    let marks = tempfile::tempdir().expect("temp dir");
    let o = marks.path().display();
    let sup = Supervisor::embedded()
        .arg("--max-attempts")
        .arg("1")
        .worker(
            "Flaky",
            &format!(
                "#!/bin/sh\n\
                 if [ -e '{o}/healed' ]; then echo healed; exit 0; fi\n\
                 echo '<b>broken</b> & <script>alert(3)</script>' >&2\n\
                 exit 3\n"
            ),
        )
        .start();
    let api = sup.api();
    let base = sup.ready_field("http");
    let id = api.create(json!({"name": "Flaky"}));
    poll("the job to fail", || {
        (api.state(id).as_deref() == Some("FAILED")).then_some(())
    });
    std::fs::write(marks.path().join("healed"), "").expect("heal");

    browser.log_in(&base, token());
    browser.goto(&format!("{base}/ui/failures"));
    heading(&browser, "Failures");
    poll("the group exit:3", || {
        (browser.text("section.group h2 code").as_deref() == Some("exit:3")).then_some(())
    });
    let tail = browser
        .prop("section.group details pre", "textContent")
        .unwrap_or_default();
    assert!(tail.contains("<script>alert(3)</script>"), "{tail}");
    assert_nothing_injected(&browser, "the failures page");
    browser.screenshot("failures-group");

    browser.click("section.group .buttons form[action$='/retry'] button");
    let question = browser.confirm();
    assert!(question.contains("exit:3"), "{question}");
    poll("the job to run again and finish", || {
        api.outcomes(id)
            .iter()
            .any(|o| o == "finished")
            .then_some(())
    });
    poll("the notice", || {
        browser
            .text(".notice")
            .filter(|t| t.contains("queued to run again"))
    });
    browser.goto(&format!("{base}/ui/jobs/{id}"));
    heading(&browser, &format!("Job {id}"));
    let outcomes = browser.texts("#live td.outcome");
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert_eq!(outcomes[0], "finished", "{outcomes:?}");
    assert!(outcomes[1].starts_with("failed"), "{outcomes:?}");
}

#[test]
fn hostile_names_data_and_output_show_as_text() {
    let Some(browser) = Browser::start("hostile_names_data_and_output_show_as_text") else {
        return;
    };
    let sup = Supervisor::embedded()
        .arg("--max-attempts")
        .arg("1")
        .arg("--job-name")
        .arg("Noisy")
        .worker(
            "Noisy",
            "#!/bin/sh\necho '<script>alert(3)</script><img src=x onerror=alert(4)>'\nexit 3\n",
        )
        .start();
    let api = sup.api();
    let base = sup.ready_field("http");
    let data = json!({"html": "<img src=x onerror=alert(2)>", "quote": "\"'></textarea>"});
    let hostile = api.create(json!({"name": HOSTILE, "data": data}));
    let noisy =
        api.create(json!({"name": "Noisy", "data": {"html": "</pre><script>alert(5)</script>"}}));
    poll("the noisy job to fail", || {
        (api.state(noisy).as_deref() == Some("FAILED")).then_some(())
    });

    browser.log_in(&base, token());
    browser.goto(&format!("{base}/ui"));
    heading(&browser, "Overview");
    poll("the hostile name on the overview", || {
        browser
            .texts("#live th a")
            .contains(&HOSTILE.to_string())
            .then_some(())
    });
    assert_nothing_injected(&browser, "the overview");

    browser.goto(&format!("{base}/ui/jobs"));
    heading(&browser, "Jobs");
    assert!(
        browser
            .texts("#live td.name")
            .contains(&HOSTILE.to_string())
    );
    assert_nothing_injected(&browser, "the jobs list");

    browser.goto(&format!("{base}/ui/jobs/{hostile}"));
    heading(&browser, &format!("Job {hostile}"));
    assert_eq!(browser.text(".facts dd.name").as_deref(), Some(HOSTILE));
    let shown: Value = serde_json::from_str(&browser.text("pre.data").expect("the data"))
        .expect("the data as JSON");
    assert_eq!(shown, data);
    assert_nothing_injected(&browser, "the hostile job's page");
    browser.screenshot("hostile-job");

    browser.goto(&format!("{base}/ui/jobs/{noisy}"));
    heading(&browser, &format!("Job {noisy}"));
    let output = browser
        .prop("#live td details pre", "textContent")
        .unwrap_or_default();
    assert!(
        output.contains("<script>alert(3)</script><img src=x onerror=alert(4)>"),
        "{output}"
    );
    assert_nothing_injected(&browser, "the noisy job's page");

    browser.goto(&format!("{base}/ui/failures"));
    heading(&browser, "Failures");
    assert_nothing_injected(&browser, "the failures page");
}
