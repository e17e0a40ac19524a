//! Rendering: the templates, embedded in the binary and escaped by default
//! (every `.html` template escapes what it prints, attributes included),
//! and what every page shows around its own part (title, navigation, the
//! CSRF token of the logout form, the live part's URL).

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use minijinja::Environment;
use serde_json::{Map, Value, json};

use super::assets::CHART_JS_VERSION;

/// The sections in the navigation: id, label, URL.
const NAV: &[(&str, &str, &str)] = &[
    ("overview", "Overview", "/ui"),
    ("jobs", "Jobs", "/ui/jobs"),
    ("running", "Running", "/ui/running"),
    ("failures", "Failures", "/ui/failures"),
    ("supervisors", "Supervisors", "/ui/supervisors"),
    ("stats", "Statistics", "/ui/stats"),
];

/// Pages with a live part, refreshed with `?live=1`.
const LIVE: &[&str] = &[
    "overview",
    "jobs",
    "job",
    "running",
    "failures",
    "supervisors",
    "stats",
];

macro_rules! templates {
    ($env:ident, $($name:literal),* $(,)?) => {
        $(
            $env.add_template($name, include_str!(concat!("templates/", $name)))
                .expect(concat!("the template ", $name, " parses"));
        )*
    };
}

/// The dashboard's templates.
pub struct Templates {
    env: Environment<'static>,
}

/// One page to render: which template, its section, title and data.
pub struct Page {
    /// The template's base name (`jobs` for `jobs.html` and `jobs_live.html`).
    pub template: &'static str,
    /// The navigation entry it belongs to.
    pub section: &'static str,
    /// Its heading.
    pub title: String,
    /// What its template shows.
    pub data: Value,
}

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

impl Templates {
    /// All templates, parsed.
    pub fn new() -> Self {
        let mut env = Environment::new();
        templates!(
            env,
            "base.html",
            "login.html",
            "error.html",
            "overview.html",
            "overview_live.html",
            "jobs.html",
            "jobs_live.html",
            "job.html",
            "job_live.html",
            "running.html",
            "running_live.html",
            "failures.html",
            "failures_live.html",
            "supervisors.html",
            "supervisors_live.html",
            "stats.html",
            "stats_live.html",
        );
        Templates { env }
    }

    /// A whole page, or its live part alone when `live`. `path_and_query`
    /// is the page's own URL (its live part's URL adds `live=1`).
    pub fn page(&self, page: Page, csrf: &str, path_and_query: &str, live: bool) -> Response {
        let mut context = match page.data {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        if live {
            context.insert("csrf".into(), json!(csrf));
            return self.render(&format!("{}_live.html", page.template), context);
        }
        let separator = if path_and_query.contains('?') {
            '&'
        } else {
            '?'
        };
        context.insert("title".into(), json!(page.title));
        context.insert("section".into(), json!(page.section));
        context.insert("csrf".into(), json!(csrf));
        if LIVE.contains(&page.template) {
            context.insert(
                "live_template".into(),
                json!(format!("{}_live.html", page.template)),
            );
            context.insert(
                "live_url".into(),
                json!(format!("{path_and_query}{separator}live=1")),
            );
        }
        self.render(&format!("{}.html", page.template), with_frame(context))
    }

    /// The login form, with why the last try failed.
    pub fn login(&self, error: Option<&str>) -> Response {
        let mut context = Map::new();
        context.insert("title".into(), json!("Log in"));
        context.insert("error".into(), json!(error));
        self.render("login.html", with_frame(context))
    }

    /// An error page: what went wrong and what to do, and a link back.
    pub fn error(&self, status: StatusCode, message: &str, back: &str, csrf: &str) -> Response {
        let mut context = Map::new();
        context.insert("title".into(), json!("Not done"));
        context.insert("message".into(), json!(message));
        context.insert("back".into(), json!(back));
        context.insert("csrf".into(), json!(csrf));
        let mut response = self.render("error.html", with_frame(context));
        *response.status_mut() = status;
        response
    }

    fn render(&self, name: &str, context: Map<String, Value>) -> Response {
        let context = minijinja::Value::from_serialize(Value::Object(context));
        self.env
            .get_template(name)
            .and_then(|t| t.render(context))
            .map(|html| Html(html).into_response())
            .unwrap_or_else(|e| {
                tracing::error!(template = name, "dashboard template failed: {e:#}");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the page could not be drawn (see the server's log); this is a bug in jobmgr",
                )
                    .into_response()
            })
    }
}

/// Adds what the frame around every page needs.
fn with_frame(mut context: Map<String, Value>) -> Map<String, Value> {
    let nav: Vec<Value> = NAV
        .iter()
        .map(|(id, label, href)| json!({"id": id, "label": label, "href": href}))
        .collect();
    context.insert("nav".into(), Value::Array(nav));
    context.insert(
        "chart_file".into(),
        json!(format!("chart-{CHART_JS_VERSION}.umd.min.js")),
    );
    context
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_renders_and_escapes_what_it_shows() {
        let templates = Templates::new();
        let hostile = "<script>alert(1)</script>";
        let page = Page {
            template: "jobs",
            section: "jobs",
            title: "Jobs".into(),
            data: json!({
                "jobs": [{"id": 1, "name": hostile, "state": "QUEUED", "priority": 500,
                          "next_run": "2026-01-01 00:00:00", "attempts": 0}],
                "filter": {"name": hostile, "state": ""},
                "state_names": ["QUEUED"],
            }),
        };
        let response = templates.page(page, "c", "/ui/jobs?name=x", false);
        assert_eq!(response.status(), StatusCode::OK);
        let body = futures_body(response);
        assert!(!body.contains(hostile), "{body}");
        assert!(
            body.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
            "{body}"
        );
        assert!(body.contains("name=x&amp;live=1\""), "{body}");
    }

    fn futures_body(response: Response) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            String::from_utf8(bytes.to_vec()).unwrap()
        })
    }
}
