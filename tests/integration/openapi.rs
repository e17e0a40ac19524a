//! The OpenAPI document is served and describes the routes that exist.

use crate::common::*;

#[test]
fn every_documented_operation_is_routed() {
    let server = Server::start();
    let api = server.api();
    let (status, doc) = api.get("/openapi.json");
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.0.3");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 12, "{paths:?}");
    let mut checked = 0;
    for (path, item) in paths {
        let concrete = path.replace("{id}", "1");
        for method in ["get", "post", "patch", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            let body = (method != "get" && method != "delete").then(|| "{}".to_string());
            let (status, answer) = api.send(&method.to_uppercase(), &concrete, body);
            let code = answer["code"].as_str().unwrap_or("");
            assert!(
                code != "no_such_route" && code != "method_not_allowed",
                "{method} {path} is documented but not routed: HTTP {status} {answer}"
            );
            // Every documented status is one the operation declares.
            let declared = item[method]["responses"].as_object().expect("responses");
            assert!(
                declared.contains_key(&status.to_string()),
                "{method} {path}: HTTP {status} is not documented: {answer}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} operations checked");
}

#[test]
fn an_undocumented_route_is_refused() {
    let server = Server::start();
    assert_error(server.api().get("/jobs/1/bogus"), 404, "no_such_route");
    assert_error(
        server.api().send("PUT", "/jobs", Some("{}".into())),
        405,
        "method_not_allowed",
    );
}
