# jobmgr %post ($1 is 1 on install, 2 on upgrade): the drop-in and pool
# directories, the state directory, and the units picked up.
install -d -m 0755 /etc/jobmgr/conf.d /etc/jobmgr/pools
# Workers pass through to their own scratch directory; they cannot list it.
install -d -m 0711 /var/lib/jobmgr
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
exit 0
