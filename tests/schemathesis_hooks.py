"""Schemathesis hooks for tests/schemathesis.sh.

A dequeue may wait up to an hour (`waitMs`, which the document allows up
to 3,600,000) for a job to be due. That is correct, and the long-poll
tests in tests/integration cover it; here it would only make the run take
hours. Waits are cut to 200 ms; everything else is sent as generated.
"""

import schemathesis

LONGEST_WAIT_MS = 200


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if (
        isinstance(body, dict)
        and isinstance(body.get("waitMs"), int)
        and not isinstance(body.get("waitMs"), bool)
        and body["waitMs"] > LONGEST_WAIT_MS
    ):
        body["waitMs"] = LONGEST_WAIT_MS
