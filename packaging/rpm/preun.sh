# jobmgr %preun: on removal ($1 = 0), disable and stop the services; stopping
# drains running jobs and hands the rest back to the job server.
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
    systemctl --no-reload disable jobmgr.service jobmgr-server.service >/dev/null 2>&1 || :
    systemctl stop jobmgr.service jobmgr-server.service 'jobmgr@*.service' >/dev/null 2>&1 || :
fi
exit 0
