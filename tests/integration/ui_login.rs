//! The dashboard's login and logout against an attacker: a wrong token
//! closes its connection and pauses logins from its address (answered 429
//! with `Retry-After`, the token unread) while other addresses and open
//! sessions go on; a logged-out session's cookie, copied before, is
//! refused (it changes nothing), after a restart too and on every server
//! of a shared PostgreSQL store, while other sessions go on.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;
use crate::ui::{cookie_of, csrf_in, get, log_in, post_form};

const HERE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const NEIGHBOUR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A login with `token`, as a form; `Connection: close` with `close`.
fn login_request(server: &Server, token: &str, close: bool) -> String {
    let body = format!("token={token}");
    format!(
        "POST /ui/login HTTP/1.1\r\nHost: {}\r\n{}\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr(),
        if close { "Connection: close\r\n" } else { "" },
        body.len()
    )
}

/// Sends a login with `token` from `from` on a new connection that asks
/// to be kept alive; returns the whole answer once the server has closed
/// the connection (panics if it does not, see [`read_until_closed`]).
fn login_closing(from: IpAddr, server: &Server, token: &str) -> String {
    let mut stream = connect_from(from, &server.addr());
    std::io::Write::write_all(&mut stream, login_request(server, token, false).as_bytes())
        .expect("write the login");
    read_until_closed(&mut stream, "a login that should close its connection")
}

/// Sends a login with `token` from `from` on a new connection, asking
/// for it to be closed after the answer; returns the answer.
fn login_once(from: IpAddr, server: &Server, token: &str) -> String {
    let mut stream = connect_from(from, &server.addr());
    std::io::Write::write_all(&mut stream, login_request(server, token, true).as_bytes())
        .expect("write the login");
    read_until_closed(&mut stream, "a login asking for Connection: close")
}

/// The whole seconds of an answer's `Retry-After`.
fn retry_after(answer: &str) -> u64 {
    answer
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("retry-after")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no Retry-After in {answer:?}"))
}

/// The pause a 401's login page announces, in whole seconds.
fn announced_pause(answer: &str) -> u64 {
    let at = answer
        .find("paused for ")
        .unwrap_or_else(|| panic!("no pause announced in {answer:?}"));
    let rest = &answer[at + "paused for ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a number of seconds")
}

fn assert_closing(answer: &str, status: &str) {
    assert!(answer.starts_with(status), "{answer:?}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer:?}"
    );
}

#[test]
fn a_wrong_dashboard_token_closes_its_connection_and_pauses_logins_from_its_address() {
    let server = Server::start();
    let base = server.url.as_str();
    let opened_before = cookie_of(&log_in(base, token()));

    // A wrong token is answered 401 and its connection closed: one
    // connection tries one token.
    let first = login_closing(HERE, &server, "wrong-1");
    assert_closing(&first, "HTTP/1.1 401");
    assert!(first.contains("paused for 1 s"), "{first}");

    // Wrong tokens from the address, each on a new connection, are
    // answered 429 while its pause lasts. The pause doubles with each
    // wrong token that was looked at, so one try comes within it in a few,
    // however slow the machine.
    let mut tries = 1;
    let paused = loop {
        let answer = login_closing(HERE, &server, &format!("wrong-{tries}"));
        if answer.starts_with("HTTP/1.1 429") {
            break answer;
        }
        assert_closing(&answer, "HTTP/1.1 401");
        tries += 1;
        assert!(tries < 10, "no try was paused after {tries} wrong tokens");
    };
    assert_closing(&paused, "HTTP/1.1 429");
    assert!(retry_after(&paused) >= 1, "{paused}");
    assert!(
        !paused.to_ascii_lowercase().contains("set-cookie"),
        "{paused}"
    );

    // Meanwhile another address logs in, and the session opened before
    // still opens the dashboard from the paused address.
    let neighbour = login_once(NEIGHBOUR, &server, token());
    assert!(neighbour.starts_with("HTTP/1.1 303"), "{neighbour}");
    assert_eq!(get(base, "/ui", Some(&opened_before)).0, 200);

    // During a pause even the right token is refused, unread. Checked when
    // the right token surely comes within the pause: the pause began
    // before the 401 that announces it was sent.
    let checked = poll(
        "a wrong token looked at, then the right one within its pause",
        || {
            let answer = login_closing(HERE, &server, "wrong-again");
            if answer.starts_with("HTTP/1.1 429") {
                std::thread::sleep(Duration::from_millis(100));
                return None;
            }
            assert_closing(&answer, "HTTP/1.1 401");
            let received = Instant::now();
            let pause = Duration::from_secs(announced_pause(&answer));
            let right = login_once(HERE, &server, token());
            (received.elapsed() + Duration::from_millis(500) < pause).then_some(right)
        },
    );
    assert_closing(&checked, "HTTP/1.1 429");

    // Once the pause is over, the right token logs in.
    let logged_in = poll("the right token to log in once the pause is over", || {
        let answer = login_once(HERE, &server, token());
        if answer.starts_with("HTTP/1.1 429") {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        Some(answer)
    });
    assert!(logged_in.starts_with("HTTP/1.1 303"), "{logged_in}");
    assert!(logged_in.contains("jobmgr_ui="), "{logged_in}");
}

#[test]
fn a_logged_out_session_cookie_is_refused_even_after_a_restart() {
    let mut server = Server::start();
    let id = server.api().create(json!({"name": "Kept"}));
    let page = format!("/ui/jobs/{id}");
    let copied = cookie_of(&log_in(&server.url, token()));
    let other = cookie_of(&log_in(&server.url, token()));
    let (status, body) = get(&server.url, &page, Some(&copied));
    assert_eq!(status, 200, "{body}");
    let csrf = csrf_in(&body);

    let out = post_form(&server.url, "/ui/logout", Some(&copied), &[("csrf", &csrf)]);
    assert_eq!(out.status().as_u16(), 303);

    // The copied cookie opens nothing and changes nothing any more.
    let (status, body) = get(&server.url, "/ui", Some(&copied));
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("logged out"), "{body}");
    deletes_nothing(&server, &page, &copied, &csrf, id);
    // Another session of the same token goes on.
    assert_eq!(get(&server.url, "/ui", Some(&other)).0, 200);

    // Cookies outlive a restart (they are signed with the token, which
    // the server keeps); the logout does too.
    server.restart();
    assert_eq!(get(&server.url, "/ui", Some(&copied)).0, 401);
    assert_eq!(get(&server.url, "/ui", Some(&other)).0, 200);
    deletes_nothing(&server, &page, &copied, &csrf, id);
}

/// A delete sent with a logged-out `cookie` is refused, and the job stays.
#[track_caller]
fn deletes_nothing(server: &Server, page: &str, cookie: &str, csrf: &str, id: i64) {
    let delete = post_form(
        &server.url,
        &format!("{page}/delete"),
        Some(cookie),
        &[("csrf", csrf)],
    );
    assert_eq!(delete.status().as_u16(), 401);
    assert_eq!(server.api().state(id).as_deref(), Some("QUEUED"));
}

/// Always on PostgreSQL (the machines and CI have it), whatever
/// `JOBMGR_TEST_STORE` says: several servers on one store.
#[test]
fn a_logout_through_one_server_ends_the_session_on_every_server_of_the_store() {
    let database = Arc::new(TestDatabase::create());
    let one = Server::builder().on_database(&database).start();
    let two = Server::builder().on_database(&database).start();
    let copied = cookie_of(&log_in(&one.url, token()));
    let other = cookie_of(&log_in(&two.url, token()));
    // A session is good on every server of the store.
    assert_eq!(get(&two.url, "/ui", Some(&copied)).0, 200);
    let (_, body) = get(&one.url, "/ui", Some(&copied));
    let out = post_form(
        &one.url,
        "/ui/logout",
        Some(&copied),
        &[("csrf", &csrf_in(&body))],
    );
    assert_eq!(out.status().as_u16(), 303);
    assert_eq!(get(&two.url, "/ui", Some(&copied)).0, 401);
    assert_eq!(get(&one.url, "/ui", Some(&copied)).0, 401);
    assert_eq!(get(&one.url, "/ui", Some(&other)).0, 200);
}
