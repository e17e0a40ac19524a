"""Schemathesis hooks for tests/schemathesis.sh.

A dequeue may wait up to an hour (`waitMs`, which the document allows up
to 3,600,000) for a job to be due. That is correct, and the long-poll
tests in tests/integration cover it; here it would only make the run take
hours. Waits are cut to 200 ms. For the same reason an event stream
(`GET /events`, endless without `durationMs`) is given `durationMs` of at
most 200 ms; a durationMs that is not a number in range is sent as
generated, to be refused.

A body of nothing but whitespace is read as no body at all (as `{}`), which
the document allows where the request body is optional (`POST /purge`, the
actions on a job or a failure group). Schemathesis' syntax fuzzing can send
such a body as "invalid JSON" and expect it refused; those cases are
dropped, only where the body is optional. Everything else is sent as
generated.
"""

import schemathesis

LONGEST_WAIT_MS = 200

# What the server takes for whitespace (Rust's u8::is_ascii_whitespace).
BLANK = frozenset(b" \t\n\r\x0c")


def _body_is_optional(operation):
    raw = getattr(getattr(operation, "definition", None), "raw", None)
    if not isinstance(raw, dict):
        return False
    request_body = raw.get("requestBody")
    return isinstance(request_body, dict) and not request_body.get("required", False)


@schemathesis.hook
def filter_body(context, body):
    if isinstance(body, (bytes, bytearray)) and all(b in BLANK for b in body):
        return not _body_is_optional(context.operation)
    return True


@schemathesis.hook
def before_call(context, case, kwargs):
    _cut_event_stream(case)
    body = case.body
    if (
        isinstance(body, dict)
        and isinstance(body.get("waitMs"), int)
        and not isinstance(body.get("waitMs"), bool)
        and body["waitMs"] > LONGEST_WAIT_MS
    ):
        body["waitMs"] = LONGEST_WAIT_MS


def _cut_event_stream(case):
    if getattr(case.operation, "path", None) != "/events":
        return
    query = dict(case.query or {})
    duration = query.get("durationMs")
    if duration is None or (
        isinstance(duration, int)
        and not isinstance(duration, bool)
        and duration > LONGEST_WAIT_MS
    ):
        query["durationMs"] = LONGEST_WAIT_MS
        case.query = query
