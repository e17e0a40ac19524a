# jobmgr %postun: on upgrade ($1 >= 1), restart what was running; a restart
# drains, so it is queued (--no-block) rather than holding the transaction.
# The job store in /var/lib/jobmgr stays on removal, as rpm leaves state.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 1 ]; then
        systemctl --no-block try-restart jobmgr.service jobmgr-server.service \
            'jobmgr@*.service' >/dev/null 2>&1 || :
    fi
fi
exit 0
