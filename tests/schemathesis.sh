#!/usr/bin/env bash
# Tests the HTTP API against its own OpenAPI document with schemathesis
# (https://schemathesis.readthedocs.io): a `jobmgr server` on loopback with a
# temporary store, every operation with generated valid and invalid input,
# and every check: no 5xx, answers that match the document's schemas, the
# status codes, content types and headers it declares, input that breaks
# the document refused, stateful links, and so on.
#
# One check is left out: positive_data_acceptance ("input the document
# allows is taken"). The document cannot say everything the server checks:
# that a time is a real calendar date, the grammar of a repeat or a
# retryAfter, that a parent job exists. Such input gets a 400 (or 404) with
# a clear error, which the other checks hold to the document.
#
#   bash tests/schemathesis.sh                # builds target/debug/jobmgr
#   JOBMGR_BIN=target/release/jobmgr bash tests/schemathesis.sh
#
# Settings (environment):
#   JOBMGR_BIN     the binary to test [default: build and use target/debug/jobmgr]
#   SCHEMATHESIS   the `st` command [default: st on the PATH]
#   MAX_EXAMPLES   test cases per operation and phase [default: 50]
#   SEED           schemathesis' random seed [default: 1, so runs repeat]
#
# Dequeue waits are cut to 200 ms (tests/schemathesis_hooks.py), so that
# the run is bounded; a blank body, which the server reads as no body, is
# not sent as "invalid JSON" where the body is optional. Exit 0 when every
# check passed; schemathesis' report otherwise, with the server's log.
set -euo pipefail
cd "$(dirname "$0")/.."

st=${SCHEMATHESIS:-st}
if ! st=$(command -v "$st"); then
  echo "schemathesis not found: pip install schemathesis==4.32.5 (or set SCHEMATHESIS=/path/to/st)" >&2
  exit 2
fi
case $st in /*) ;; *) st=$PWD/$st ;; esac
bin=${JOBMGR_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --locked --bin jobmgr
  bin=target/debug/jobmgr
fi

tmp=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

mkfifo "$tmp/ready"
"$bin" server --db "$tmp/jobs.db" --http 127.0.0.1:0 --bedrock none \
  > "$tmp/ready" 2> "$tmp/server.log" &
pid=$!
# The first line on stdout says where it listens; a deadline, not a sleep.
exec 3< "$tmp/ready"
if ! read -r -t 30 line <&3; then
  echo "jobmgr server did not print its ready line within 30s; its log:" >&2
  cat "$tmp/server.log" >&2
  exit 1
fi
# Keep draining stdout so that the server never blocks on it.
cat <&3 > /dev/null &
url=
for word in $line; do
  case $word in http=*) url=${word#http=} ;; esac
done
if [ -z "$url" ]; then
  echo "no http= in the ready line: $line" >&2
  exit 1
fi
echo "jobmgr server (pid $pid) at $url"
# Every route but /healthz needs the token the server made beside its store.
token=$(cat "$tmp/token")

status=0
# From the temporary directory, where schemathesis keeps its cache.
(
  cd "$tmp"
  SCHEMATHESIS_HOOKS=schemathesis_hooks PYTHONPATH="$OLDPWD/tests${PYTHONPATH:+:$PYTHONPATH}" \
  "$st" run "$url/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks all \
  --exclude-checks positive_data_acceptance \
  --max-examples "${MAX_EXAMPLES:-50}" \
  --seed "${SEED:-1}" \
  --generation-database none \
  --request-timeout 30 \
  --report junit --report-dir "$tmp/report" \
  --no-color
) || status=$?

if [ "$status" != 0 ]; then
  echo "--- server log (last 100 lines)" >&2
  tail -n 100 "$tmp/server.log" >&2
fi
exit "$status"
