//! The dashboard's static files, embedded in the binary: its stylesheet and
//! script, and the vendored chart library (`assets/vendor/`, see its
//! README for the version and how to update it). The chart library's URL
//! carries its version, so it is cached for a day; the dashboard's own
//! stylesheet and script are not versioned and are fetched again by each
//! page (`no-cache`: a few KiB), so that an upgrade's pages never run an
//! older script.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The vendored Chart.js version (its file's URL names it).
pub const CHART_JS_VERSION: &str = "4.6.1";

/// One embedded file: its name under `/ui/assets/`, type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
    /// Its `Cache-Control`.
    cache: &'static str,
}

/// A file whose URL names no version: checked again on every use.
const UNVERSIONED: &str = "no-cache";

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("static/app.css"),
        cache: UNVERSIONED,
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("static/app.js"),
        cache: UNVERSIONED,
    },
    Asset {
        name: "chart-4.6.1.umd.min.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../../assets/vendor/chart.js/chart.umd.min.js"),
        cache: "public, max-age=86400",
    },
];

/// `GET /ui/assets/{name}`.
pub async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => (
            [
                (header::CONTENT_TYPE, asset.content_type),
                (header::CACHE_CONTROL, asset.cache),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            asset.bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_versioned_file_is_cached() {
        for asset in ASSETS {
            let versioned = asset.name.contains(CHART_JS_VERSION);
            assert_eq!(asset.cache == UNVERSIONED, !versioned, "{}", asset.name);
        }
    }

    #[test]
    fn the_chart_file_is_the_pinned_version() {
        let chart = ASSETS
            .iter()
            .find(|a| a.name.starts_with("chart-"))
            .unwrap();
        assert!(chart.name.contains(CHART_JS_VERSION));
        let head = String::from_utf8_lossy(&chart.bytes[..100]);
        assert!(
            head.contains(&format!("Chart.js v{CHART_JS_VERSION}")),
            "{head}"
        );
    }
}
