#!/bin/sh
# Runs inside a container booted by systemd (packaging/check.sh starts it
# with systemd-nspawn after installing the .deb): the units for real, as an
# operator would use them. Writes its findings to /boot-test.log and PASS or
# FAIL to /boot-test.result, then powers the container off.
set -u
exec >>/boot-test.log 2>&1

finish() {
    echo "$1" >/boot-test.result
    systemctl --no-block poweroff
    exit 0
}
fail() {
    echo "FAIL: $*"
    for unit in jobmgr jobmgr-server jobmgr@batch; do
        journalctl -u "$unit" --no-pager -n 30 || true
    done
    finish FAIL
}
ok() { echo "ok: $*"; }

# Polls a condition for up to 60 s.
until_true() {
    n=0
    until sh -c "$1" >/dev/null 2>&1; do
        n=$((n + 1))
        [ "$n" -le 600 ] || return 1
        sleep 0.1
    done
}
# A finished job is deleted (Bedrock semantics), so the test's jobs repeat
# hourly: once run they are queued again carrying the worker's output as data.
create() { jobmgr job create --format text --repeat "FINISHED, +1 HOUR" "$1"; }
query() { jobmgr job query --format json "$1" | tr -d ' \n'; }
wait_for() {
    until_true "jobmgr job query --format json $1 | tr -d ' \\n' | grep -q '$2'" ||
        fail "job $1 never showed $2: $(query "$1")"
}

echo "== boot test $(date -u)"

# Workers. Who runs them is their output; Nap sleeps then reports.
install -d -m 0755 /srv/jobmgr/workers /srv/jobmgr/batch
cat >/srv/jobmgr/workers/Whoami <<'SH'
#!/bin/sh
cat >/dev/null
echo "{\"uid\":$(id -u),\"groups\":\"$(id -G)\",\"cgroup\":\"$(cut -d: -f3 /proc/self/cgroup | tail -1)\"}"
SH
cat >/srv/jobmgr/workers/Nap <<'SH'
#!/bin/sh
cat >/dev/null
sleep 4
echo '{"napped":true}'
SH
cp /srv/jobmgr/workers/Whoami /srv/jobmgr/batch/Whoami
chmod 755 /srv/jobmgr/workers/* /srv/jobmgr/batch/*

# A short watchdog, so that a missing ping shows within the test.
for unit in jobmgr jobmgr-server jobmgr@; do
    mkdir -p "/etc/systemd/system/$unit.service.d"
    printf '[Service]\nWatchdogSec=4s\n' >"/etc/systemd/system/$unit.service.d/watchdog.conf"
done
systemctl daemon-reload

# The server, hardened, under a dynamic user.
systemctl enable --now jobmgr-server || fail "jobmgr-server did not start"
systemctl is-active jobmgr-server || fail "jobmgr-server is not active"
pid=$(systemctl show -p MainPID --value jobmgr-server)
user=$(ps -o user= -p "$pid")
[ "$user" != root ] || fail "jobmgr-server runs as root"
ok "jobmgr-server is active (notify) as $user with its store in $(ls -d /var/lib/private/jobmgr-server)"
systemd-analyze security jobmgr-server --no-pager | tail -1
systemd-analyze security jobmgr --no-pager | tail -1

# The supervisor, pointed at it by a drop-in.
printf 'server = "http://127.0.0.1:8889"\nmax-load = 100.0\n' >/etc/jobmgr/conf.d/10-test.toml
jobmgr check-config >/dev/null || fail "check-config refused the drop-in"
systemctl enable --now jobmgr || fail "jobmgr did not start"
ok "jobmgr is active (notify)"

id=$(create Whoami) || fail "cannot create a job"
wait_for "$id" '"uid":'
uid=$(query "$id" | grep -o '"uid":[0-9]*' | cut -d: -f2)
[ "$uid" -ge 60706 ] && [ "$uid" -le 61183 ] || fail "the worker did not run under a uid of its own from worker-uids: $(query "$id")"
query "$id" | grep -q "\"groups\":\"$uid\"" || fail "the worker's groups are not its own gid alone: $(query "$id")"
ok "a job ran under uid $uid of its own, in $(query "$id" | grep -o '"cgroup":"[^"]*"')"

# A restart drains: the running job finishes; it is not killed.
id=$(create Nap)
wait_for "$id" '"state":"RUNNING"'
systemctl restart jobmgr || fail "restart failed"
query "$id" | grep -q '"napped":true' || fail "restart did not let the running job finish: $(query "$id")"
systemctl is-active jobmgr || fail "jobmgr did not come back after restart"
ok "systemctl restart drained the running job, then started again"

systemctl reload jobmgr || fail "reload failed"
jobmgr status >/dev/null || fail "jobmgr status cannot read the running supervisor"
ok "reload and jobmgr status"

# One supervisor per pool file.
cat >/etc/jobmgr/pools/batch.toml <<'TOML'
server = "http://127.0.0.1:8889"
job-name = "batch/*"
worker-path = "/srv/jobmgr/batch"
max-load = 100.0
TOML
systemctl start jobmgr@batch || fail "jobmgr@batch did not start"
id=$(create batch/Whoami)
wait_for "$id" '"uid":'
[ -f /var/lib/jobmgr/batch/status.json ] || fail "jobmgr@batch keeps no state in /var/lib/jobmgr/batch"
ok "jobmgr@batch ran batch/Whoami with its state in /var/lib/jobmgr/batch"

# The watchdog (4 s here) has been pinged all along: nothing restarted.
sleep 9
for unit in jobmgr jobmgr-server jobmgr@batch; do
    restarts=$(systemctl show -p NRestarts --value "$unit")
    [ "$restarts" = 0 ] || fail "$unit restarted $restarts times (watchdog?)"
    systemctl is-active "$unit" >/dev/null || fail "$unit is not active"
done
ok "no restarts under a 4 s watchdog"

# A configuration error waits for the operator instead of looping.
echo 'max-load = "lots"' >/etc/jobmgr/conf.d/20-bad.toml
systemctl restart jobmgr && fail "a bad configuration started"
sleep 3
[ "$(systemctl show -p NRestarts --value jobmgr)" = 0 ] || fail "a configuration error was restarted"
journalctl -u jobmgr --no-pager | grep -q '20-bad.toml' || fail "the journal does not name the bad file"
ok "a bad configuration fails once, naming the file"

finish PASS
