# jobmgr %post ($1 is 1 on install, 2 on upgrade): the units picked up. The
# package owns /etc/jobmgr, conf.d, pools and /var/lib/jobmgr (the spec's
# %files, with their modes).
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
exit 0
