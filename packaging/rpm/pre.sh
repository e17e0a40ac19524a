# jobmgr %pre: the jobmgr account workers run as.
getent group jobmgr >/dev/null || groupadd --system jobmgr
getent passwd jobmgr >/dev/null || useradd --system --gid jobmgr \
    --home-dir /nonexistent --no-create-home --shell /sbin/nologin \
    --comment "jobmgr workers" jobmgr
exit 0
