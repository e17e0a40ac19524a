# jobmgr %preun: on removal ($1 = 0), disable and stop the services, pool
# instances (jobmgr@NAME) included; stopping drains running jobs and hands
# the rest back to the job server. The enabled instances are those with a
# link in a .wants directory (systemctl disable takes no pattern).
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
    instances=$(ls -1 /etc/systemd/system/*.wants/ 2>/dev/null | grep -x 'jobmgr@..*\.service' | sort -u)
    # shellcheck disable=SC2086 # one word per instance
    systemctl --no-reload disable jobmgr.service jobmgr-server.service $instances >/dev/null 2>&1 || :
    systemctl stop jobmgr.service jobmgr-server.service 'jobmgr@*.service' >/dev/null 2>&1 || :
fi
exit 0
