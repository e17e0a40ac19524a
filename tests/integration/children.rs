//! Parent and child jobs (spec §5) over the HTTP API of the real binary:
//! children wait PAUSED for their parent, run while it is PAUSED, and the
//! parent resumes with their results; CancelJob, and every refusal on the way.

use crate::common::*;

use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// Helpers

/// A fresh server and a caller for it.
fn setup() -> (Server, Api) {
    let server = Server::start();
    let api = server.api();
    (server, api)
}

/// Asserts an error answer's HTTP status, code and Bedrock message.
#[track_caller]
fn assert_refused(answer: (u16, Value), status: u16, code: &str, message: &str) {
    assert_eq!(
        (
            answer.0,
            answer.1["code"].as_str().unwrap_or(""),
            answer.1["message"].as_str().unwrap_or("")
        ),
        (status, code, message),
        "answer: {}",
        answer.1
    );
}

/// Asserts a 200 answer and returns its body.
#[track_caller]
fn ok(answer: (u16, Value)) -> Value {
    assert_eq!(answer.0, 200, "expected success, got {}", answer.1);
    answer.1
}

fn finish(api: &Api, id: i64, body: Value) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/finish"), body)
}

fn retry(api: &Api, id: i64, body: Value) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/retry"), body)
}

fn fail(api: &Api, id: i64) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/fail"), json!({}))
}

fn cancel(api: &Api, id: i64) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/cancel"), json!({}))
}

/// The state of a job that must exist.
#[track_caller]
fn state(api: &Api, id: i64) -> String {
    api.state(id).unwrap_or_else(|| panic!("job {id} is gone"))
}

/// Creates a job and hands it out; returns its id.
#[track_caller]
fn start_job(api: &Api, name: &str, data: Value) -> i64 {
    let id = api.create(json!({"name": name, "data": data}));
    assert_eq!(api.take(name)["jobID"], id, "another job was handed out");
    id
}

/// Hands out the one due job called `name` and checks it is `id`; returns
/// the hand-out.
#[track_caller]
fn take_id(api: &Api, name: &str, id: i64) -> Value {
    let job = api.take(name);
    assert_eq!(job["jobID"], id, "another job was handed out: {job}");
    job
}

/// Creates a child of `parent`.
#[track_caller]
fn child(api: &Api, parent: i64, name: &str, data: Value) -> i64 {
    api.create(json!({"name": name, "parentJobID": parent, "data": data}))
}

/// `[{jobID, data}, …]` sorted by jobID.
fn sorted_children(list: &Value) -> Vec<Value> {
    let mut items = list
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .clone();
    items.sort_by_key(|c| c["jobID"].as_i64());
    items
}

/// A RUNNING parent with three children, c1 and c3 finished with results
/// and c2 cancelled; the parent QUEUED again. Returns (parent, c1, c2, c3).
fn family_whose_children_are_done(api: &Api, repeat: Option<&str>) -> (i64, i64, i64, i64) {
    let mut body = json!({"name": "parent", "data": {"p": 1}});
    if let Some(repeat) = repeat {
        body["repeat"] = json!(repeat);
    }
    let parent = api.create(body);
    take_id(api, "parent", parent);
    let c1 = child(api, parent, "child-1", json!({"i": 1}));
    let c2 = child(api, parent, "child-2", json!({"i": 2}));
    let c3 = child(api, parent, "child-3", json!({"i": 3}));
    ok(finish(api, parent, json!({})));

    take_id(api, "child-1", c1);
    ok(finish(api, c1, json!({"data": {"result": "one"}})));
    ok(cancel(api, c2));
    take_id(api, "child-3", c3);
    ok(finish(api, c3, json!({"data": {"result": "three"}})));
    assert_eq!(state(api, parent), "QUEUED");
    (parent, c1, c2, c3)
}

// ---------------------------------------------------------------------------
// The cycle

#[test]
fn children_of_a_running_parent_start_paused_and_are_not_handed_out() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c1 = child(&api, parent, "child", json!({"i": 1}));
    let c2 = child(&api, parent, "child", json!({"i": 2}));
    for c in [c1, c2] {
        let job = api.job(c);
        assert_eq!(job["state"], "PAUSED");
        assert_eq!(job["parentJobID"], parent);
    }
    assert!(
        api.dequeue(json!({"name": "*", "numResults": 10}))
            .is_empty(),
        "nothing may be handed out while the parent runs"
    );
    assert_eq!(state(&api, parent), "RUNNING");
}

#[test]
fn parent_finish_pauses_the_parent_and_queues_its_children() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c1 = child(&api, parent, "child", json!({"i": 1}));
    let c2 = child(&api, parent, "child", json!({"i": 2}));
    ok(finish(&api, parent, json!({"data": {"stage": 2}})));

    assert_eq!(state(&api, parent), "PAUSED");
    assert_eq!(api.job(parent)["data"], json!({"stage": 2}));
    assert_eq!(state(&api, c1), "QUEUED");
    assert_eq!(state(&api, c2), "QUEUED");
    assert!(
        api.dequeue(json!({"name": "parent"})).is_empty(),
        "a PAUSED parent is not handed out"
    );
    let handed = api.dequeue(json!({"name": "child", "numResults": 10}));
    let mut got: Vec<i64> = handed
        .iter()
        .map(|j| j["jobID"].as_i64().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, vec![c1, c2]);
}

#[test]
fn children_carry_parent_id_and_parent_data_when_handed_out() {
    let (_server, api) = setup();
    let parent = api.create(json!({"name": "parent", "data": {"account": 7}}));
    let first = take_id(&api, "parent", parent);
    assert!(first.get("parentJobID").is_none() && first.get("parentData").is_none());
    let c = child(&api, parent, "child", json!({"i": 1}));
    ok(finish(
        &api,
        parent,
        json!({"data": {"account": 7, "stage": "children"}}),
    ));

    let handed = take_id(&api, "child", c);
    assert_eq!(handed["parentJobID"], parent);
    assert_eq!(
        handed["parentData"],
        json!({"account": 7, "stage": "children"})
    );
    assert_eq!(handed["data"], json!({"i": 1}));
}

#[test]
fn each_child_finish_marks_it_finished_and_the_last_one_resumes_the_parent() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c1 = child(&api, parent, "child-1", json!({}));
    let c2 = child(&api, parent, "child-2", json!({}));
    ok(finish(&api, parent, json!({})));
    take_id(&api, "child-1", c1);
    take_id(&api, "child-2", c2);

    ok(finish(&api, c1, json!({"data": {"r": 1}})));
    assert_eq!(state(&api, c1), "FINISHED");
    assert_eq!(api.job(c1)["data"], json!({"r": 1}));
    assert_eq!(state(&api, parent), "PAUSED", "c2 is still running");
    assert!(api.dequeue(json!({"name": "parent"})).is_empty());

    ok(finish(&api, c2, json!({"data": {"r": 2}})));
    assert_eq!(state(&api, c2), "FINISHED");
    assert_eq!(state(&api, parent), "QUEUED");
    take_id(&api, "parent", parent);
}

#[test]
fn resumed_parent_hand_out_carries_finished_and_cancelled_children() {
    let (_server, api) = setup();
    let (parent, c1, c2, c3) = family_whose_children_are_done(&api, None);
    let handed = take_id(&api, "parent", parent);
    assert_eq!(
        sorted_children(&handed["finishedChildJobs"]),
        vec![
            json!({"jobID": c1, "data": {"result": "one"}}),
            json!({"jobID": c3, "data": {"result": "three"}}),
        ]
    );
    assert_eq!(
        sorted_children(&handed["cancelledChildJobs"]),
        vec![json!({"jobID": c2, "data": {"i": 2}})]
    );
    assert_eq!(handed["data"], json!({"p": 1}));
}

#[test]
fn resumed_parent_finish_deletes_its_finished_and_cancelled_children() {
    let (_server, api) = setup();
    let (parent, c1, c2, c3) = family_whose_children_are_done(&api, None);
    take_id(&api, "parent", parent);
    ok(finish(&api, parent, json!({})));
    for id in [parent, c1, c2, c3] {
        assert_eq!(api.state(id), None, "job {id} should be gone");
    }
}

#[test]
fn repeating_parent_finish_deletes_its_children_and_repeats() {
    let (_server, api) = setup();
    let (parent, c1, c2, c3) = family_whose_children_are_done(&api, Some("FINISHED, +1 HOUR"));
    take_id(&api, "parent", parent);
    ok(finish(&api, parent, json!({})));
    assert_eq!(state(&api, parent), "QUEUED");
    for id in [c1, c2, c3] {
        assert_eq!(api.state(id), None, "child {id} should be gone");
    }
}

#[test]
fn child_created_while_the_parent_is_paused_runs_at_once_and_holds_the_parent() {
    // The spec allows creating a child of a PAUSED parent; rules.rs queues
    // such a child at once (a sibling made by a running child).
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let first = child(&api, parent, "child", json!({}));
    ok(finish(&api, parent, json!({})));
    take_id(&api, "child", first);

    let sibling = child(&api, parent, "sibling", json!({"late": true}));
    assert_eq!(state(&api, sibling), "QUEUED");
    ok(finish(&api, first, json!({})));
    assert_eq!(state(&api, parent), "PAUSED", "the sibling is still to run");

    let handed = take_id(&api, "sibling", sibling);
    assert_eq!(handed["parentJobID"], parent);
    ok(finish(&api, sibling, json!({})));
    assert_eq!(state(&api, parent), "QUEUED");
    let resumed = take_id(&api, "parent", parent);
    let finished: Vec<i64> = sorted_children(&resumed["finishedChildJobs"])
        .iter()
        .map(|c| c["jobID"].as_i64().unwrap())
        .collect();
    assert_eq!(finished, vec![first, sibling]);
}

// ---------------------------------------------------------------------------
// CancelJob

#[test]
fn cancel_job_on_a_queued_child_cancels_it_and_resumes_the_parent_when_none_is_left() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c1 = child(&api, parent, "child", json!({"i": 1}));
    let c2 = child(&api, parent, "child", json!({"i": 2}));
    ok(finish(&api, parent, json!({})));

    ok(cancel(&api, c1));
    assert_eq!(state(&api, c1), "CANCELLED");
    assert_eq!(state(&api, parent), "PAUSED", "c2 is still queued");
    ok(cancel(&api, c2));
    assert_eq!(state(&api, c2), "CANCELLED");
    assert_eq!(state(&api, parent), "QUEUED");
    assert!(
        api.dequeue(json!({"name": "child"})).is_empty(),
        "cancelled children are not handed out"
    );

    let resumed = take_id(&api, "parent", parent);
    assert_eq!(
        sorted_children(&resumed["cancelledChildJobs"]),
        vec![
            json!({"jobID": c1, "data": {"i": 1}}),
            json!({"jobID": c2, "data": {"i": 2}}),
        ]
    );
    assert_eq!(resumed["finishedChildJobs"], json!([]));
}

#[test]
fn cancel_job_does_not_resume_the_parent_while_a_sibling_runs() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let running = child(&api, parent, "child-run", json!({}));
    let queued = child(&api, parent, "child-queued", json!({}));
    ok(finish(&api, parent, json!({})));
    take_id(&api, "child-run", running);

    ok(cancel(&api, queued));
    assert_eq!(state(&api, queued), "CANCELLED");
    assert_eq!(state(&api, parent), "PAUSED");
    ok(finish(&api, running, json!({})));
    assert_eq!(state(&api, parent), "QUEUED");
}

#[test]
fn cancel_job_on_a_runqueued_or_failed_child_cancels_it() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let runqueued = api.create(json!({
        "name": "child-ra",
        "parentJobID": parent,
        "retryAfter": "+1 HOUR",
    }));
    let failed = child(&api, parent, "child-fail", json!({}));
    ok(finish(&api, parent, json!({})));

    take_id(&api, "child-ra", runqueued);
    assert_eq!(state(&api, runqueued), "RUNQUEUED");
    ok(cancel(&api, runqueued));
    assert_eq!(state(&api, runqueued), "CANCELLED");

    take_id(&api, "child-fail", failed);
    ok(fail(&api, failed));
    assert_eq!(state(&api, failed), "FAILED");
    // FailJob does not resume the parent (as in Bedrock); the failed child
    // must be cancelled for the parent to go on.
    assert_eq!(state(&api, parent), "PAUSED");
    ok(cancel(&api, failed));
    assert_eq!(state(&api, failed), "CANCELLED");
    assert_eq!(state(&api, parent), "QUEUED");
}

#[test]
fn cancel_job_on_a_parent_is_refused() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c = child(&api, parent, "child", json!({}));
    assert_refused(
        cancel(&api, parent),
        404,
        "cancel_parent",
        "Invalid jobID - Cannot cancel a job with children",
    );
    assert_eq!(state(&api, parent), "RUNNING");
    ok(finish(&api, parent, json!({})));
    assert_refused(
        cancel(&api, parent),
        404,
        "cancel_parent",
        "Invalid jobID - Cannot cancel a job with children",
    );
    assert_eq!(state(&api, parent), "PAUSED");
    assert_eq!(state(&api, c), "QUEUED");
}

#[test]
fn cancel_job_on_a_job_without_parent_is_refused() {
    let (_server, api) = setup();
    let queued = api.create(json!({"name": "alone"}));
    assert_refused(
        cancel(&api, queued),
        404,
        "cancel_orphan",
        "Invalid jobID - Cannot cancel a job without a parent",
    );
    assert_eq!(state(&api, queued), "QUEUED");
    let running = start_job(&api, "alone-running", json!({}));
    assert_refused(
        cancel(&api, running),
        404,
        "cancel_orphan",
        "Invalid jobID - Cannot cancel a job without a parent",
    );
    assert_eq!(state(&api, running), "RUNNING");
}

#[test]
fn cancel_job_on_a_running_or_finished_child_changes_nothing() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let running = child(&api, parent, "child-run", json!({}));
    let done = child(&api, parent, "child-done", json!({}));
    ok(finish(&api, parent, json!({})));
    take_id(&api, "child-run", running);
    take_id(&api, "child-done", done);
    ok(finish(&api, done, json!({})));

    ok(cancel(&api, running));
    assert_eq!(state(&api, running), "RUNNING");
    ok(cancel(&api, done));
    assert_eq!(state(&api, done), "FINISHED");
    assert_eq!(state(&api, parent), "PAUSED");

    ok(finish(&api, running, json!({})));
    assert_eq!(state(&api, running), "FINISHED");
    assert_eq!(state(&api, parent), "QUEUED");
}

#[test]
fn cancel_job_on_a_paused_child_changes_nothing() {
    // The spec lists QUEUED, RUNQUEUED and FAILED children as cancellable;
    // rules.rs treats a PAUSED one (its parent still running) as a no-op.
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c = child(&api, parent, "child", json!({}));
    ok(cancel(&api, c));
    assert_eq!(state(&api, c), "PAUSED");
    ok(finish(&api, parent, json!({})));
    assert_eq!(
        state(&api, c),
        "QUEUED",
        "released with its parent's finish"
    );
}

// ---------------------------------------------------------------------------
// Refusals

#[test]
fn child_cannot_be_finished_or_retried_unless_its_parent_is_paused() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c = child(&api, parent, "child", json!({}));
    assert_refused(
        finish(&api, c, json!({})),
        409,
        "not_held_for_finish",
        "Can only retry/finish RUNNING and RUNQUEUED jobs",
    );

    // Requeued by hand while the parent runs, the child can be handed out...
    ok(api.post("/jobs/requeue", json!({"jobIDs": [c]})));
    take_id(&api, "child", c);
    // ...but not reported on until its parent is PAUSED.
    assert_refused(
        finish(&api, c, json!({"data": {"r": 1}})),
        409,
        "parent_not_paused",
        "Can only retry/finish child job when parent is PAUSED",
    );
    assert_refused(
        retry(&api, c, json!({})),
        409,
        "parent_not_paused",
        "Can only retry/finish child job when parent is PAUSED",
    );
    assert_eq!(state(&api, c), "RUNNING");
    assert_eq!(api.job(c)["data"], json!({}));

    ok(finish(&api, parent, json!({})));
    assert_eq!(state(&api, parent), "PAUSED");
    ok(finish(&api, c, json!({"data": {"r": 1}})));
    assert_eq!(state(&api, c), "FINISHED");
    assert_eq!(state(&api, parent), "QUEUED");
}

#[test]
fn grandchildren_are_refused() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c = child(&api, parent, "child", json!({}));
    assert_refused(
        api.post("/jobs", json!({"name": "grandchild", "parentJobID": c})),
        409,
        "grandchild",
        "Cannot create grandchildren",
    );
    ok(finish(&api, parent, json!({})));
    take_id(&api, "child", c);
    assert_refused(
        api.post("/jobs", json!({"name": "grandchild", "parentJobID": c})),
        409,
        "grandchild",
        "Cannot create grandchildren",
    );
    let (_, list) = api.get("/jobs?name=grandchild");
    assert_eq!(list["jobs"], json!([]), "no grandchild was created");
}

#[test]
fn child_of_a_queued_or_failed_parent_is_refused() {
    let (_server, api) = setup();
    let queued = api.create(json!({"name": "queued-parent"}));
    assert_refused(
        api.post("/jobs", json!({"name": "kid", "parentJobID": queued})),
        409,
        "parent_not_running",
        "Can only create child job when parent is RUNNING, RUNQUEUED or PAUSED",
    );
    let failed = start_job(&api, "failed-parent", json!({}));
    ok(fail(&api, failed));
    assert_refused(
        api.post("/jobs", json!({"name": "kid", "parentJobID": failed})),
        409,
        "parent_not_running",
        "Can only create child job when parent is RUNNING, RUNQUEUED or PAUSED",
    );
    let (_, list) = api.get("/jobs?name=kid");
    assert_eq!(list["jobs"], json!([]), "no child was created");

    // A RUNQUEUED parent may have children.
    let runqueued = api.create(json!({"name": "ra-parent", "retryAfter": "+1 HOUR"}));
    take_id(&api, "ra-parent", runqueued);
    assert_eq!(state(&api, runqueued), "RUNQUEUED");
    let kid = child(&api, runqueued, "kid", json!({}));
    assert_eq!(state(&api, kid), "PAUSED");
}

#[test]
fn child_of_a_missing_parent_is_refused() {
    let (_server, api) = setup();
    assert_refused(
        api.post("/jobs", json!({"name": "kid", "parentJobID": 424242})),
        404,
        "parent_missing",
        "parentJobID does not exist",
    );
    assert_refused(
        api.post("/jobs", json!({"name": "kid", "parentJobID": -1})),
        400,
        "malformed_parent_job_id",
        "Malformed parentJobID",
    );
    let (_, list) = api.get("/jobs");
    assert_eq!(list["jobs"], json!([]), "no job was created");
    // parentJobID 0 means no parent.
    let plain = api.create(json!({"name": "kid", "parentJobID": 0}));
    assert_eq!(api.job(plain)["parentJobID"], 0);
    assert_eq!(state(&api, plain), "QUEUED");
}

#[test]
fn unique_child_of_another_parent_is_refused() {
    let (_server, api) = setup();
    let p1 = start_job(&api, "parent-1", json!({}));
    let p2 = start_job(&api, "parent-2", json!({}));
    let body = |parent: i64| json!({"name": "kid", "parentJobID": parent, "unique": true});
    let kid = api.create(body(p1));
    assert_eq!(api.create(body(p1)), kid, "same parent: the same child");
    assert_refused(
        api.post("/jobs", body(p2)),
        404,
        "child_of_other_parent",
        "Trying to create a child that already exists, but it is tied to a different parent",
    );
    let (_, list) = api.get("/jobs?name=kid");
    assert_eq!(list["jobs"].as_array().map(Vec::len), Some(1));
}

#[test]
fn paused_parent_cannot_be_deleted() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let c = child(&api, parent, "child", json!({}));
    ok(finish(&api, parent, json!({})));
    assert_refused(
        api.delete(&format!("/jobs/{parent}")),
        409,
        "delete_paused",
        "Can't delete a parent jobs with children running",
    );
    assert_eq!(state(&api, parent), "PAUSED");
    assert_eq!(state(&api, c), "QUEUED");
}

#[test]
fn failed_child_blocks_the_parents_final_finish_until_it_is_cancelled() {
    let (_server, api) = setup();
    let parent = start_job(&api, "parent", json!({}));
    let failed = child(&api, parent, "child-fail", json!({}));
    let done = child(&api, parent, "child-done", json!({}));
    ok(finish(&api, parent, json!({})));
    take_id(&api, "child-fail", failed);
    ok(fail(&api, failed));
    take_id(&api, "child-done", done);
    ok(finish(&api, done, json!({"data": {"ok": true}})));
    // A FAILED child is not left to run: the parent resumes.
    assert_eq!(state(&api, parent), "QUEUED");

    let resumed = take_id(&api, "parent", parent);
    assert_eq!(
        sorted_children(&resumed["finishedChildJobs"]),
        vec![json!({"jobID": done, "data": {"ok": true}})]
    );
    assert_eq!(resumed["cancelledChildJobs"], json!([]));
    assert_refused(
        finish(&api, parent, json!({})),
        409,
        "outstanding_children",
        "Failed to delete a job with outstanding children",
    );
    // The refusal changed nothing, not even the finished child.
    assert_eq!(state(&api, parent), "RUNNING");
    assert_eq!(state(&api, done), "FINISHED");
    assert_eq!(state(&api, failed), "FAILED");

    ok(cancel(&api, failed));
    assert_eq!(state(&api, failed), "CANCELLED");
    ok(finish(&api, parent, json!({})));
    for id in [parent, failed, done] {
        assert_eq!(api.state(id), None, "job {id} should be gone");
    }
}
