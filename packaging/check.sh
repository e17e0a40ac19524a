#!/usr/bin/env bash
# Builds the deb and rpm packages and checks them as an operator would meet
# them: metadata and contents, the maintainer scripts, `systemd-analyze
# verify` on every unit, and the .deb installed, upgraded, removed and
# purged in a throwaway Debian root (debootstrap), with `jobmgr --version`
# and `jobmgr check-config` run inside it; then that root booted with
# systemd-nspawn, where packaging/boot-test.sh drives the units for real;
# then the .deb in an old distribution's root (Debian 11, glibc 2.31): the
# packaged binary is linked against glibc 2.28 and must run there.
# Run as root: `bash packaging/check.sh`.
# Needs cargo-deb, rpm (rpmbuild), debootstrap and systemd-container.
set -euo pipefail
# No `| head` here: under pipefail, a writer cut off by SIGPIPE fails the
# pipeline at random; `sed -n 1p` reads to the end.
cd "$(dirname "$0")/.."

out=target/packaging
step() { printf '\n--> %s\n' "$*"; }
fail() {
    echo "packaging check failed: $*" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || fail "run it as root: it installs the package into a chroot"

bash packaging/build.sh
deb=$(ls "$out"/jobmgr_*.deb)
rpm=$(ls "$out"/jobmgr-*.rpm)
version=$(dpkg-deb -f "$deb" Version)

tmp=$(mktemp -d)
root="$tmp/root"
server=
# Stops the bullseye check's server: its whole process group, then waits.
stop_server() {
    if [ -n "$server" ]; then
        kill -- "-$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=
    fi
}
cleanup() {
    stop_server
    for r in "$tmp/root" "$tmp/bullseye"; do
        if mountpoint -q "$r/proc" 2>/dev/null; then umount "$r/proc"; fi
    done
    rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

# What both packages must install.
files="/usr/bin/jobmgr /etc/jobmgr/jobmgr.toml
/usr/share/bash-completion/completions/jobmgr /usr/share/fish/vendor_completions.d/jobmgr.fish
/usr/share/man/man1/jobmgr.1.gz /usr/share/doc/jobmgr/examples/pool.toml
/usr/share/jobmgr/bwm-php-runner.php"
units="jobmgr.service jobmgr@.service jobmgr-server.service"

step "deb: metadata"
dpkg-deb -I "$deb"
for field in Package Version Architecture Maintainer Depends Section Description; do
    [ -n "$(dpkg-deb -f "$deb" "$field")" ] || fail "the deb has no $field"
done
dpkg-deb -f "$deb" Depends | grep -q passwd || fail "the deb does not depend on passwd (useradd)"
dpkg-deb -f "$deb" Depends | grep -q procps || fail "the deb does not depend on procps (/bin/kill)"
dpkg-deb -I "$deb" conffiles | grep -qx /etc/jobmgr/jobmgr.toml ||
    fail "/etc/jobmgr/jobmgr.toml is not a conffile of the deb"

step "deb: contents"
dpkg-deb -c "$deb"
deb_paths=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\.||')
for path in $files /usr/share/zsh/vendor-completions/_jobmgr; do
    grep -qx "$path" <<<"$deb_paths" || fail "the deb lacks $path"
done
for unit in $units; do
    grep -qx "/lib/systemd/system/$unit" <<<"$deb_paths" || fail "the deb lacks the unit $unit"
done

changelog=/usr/share/doc/jobmgr/changelog.Debian.gz
grep -qx "$changelog" <<<"$deb_paths" || fail "the deb has no changelog ($changelog)"
dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ".$changelog" | zcat | sed -n 1p |
    grep -q "^jobmgr ($version) " ||
    fail "the deb's changelog does not begin with jobmgr ($version): add an entry to packaging/debian/changelog"

step "the packaged binary needs glibc 2.28 at most (RHEL 8, Debian 11, Ubuntu 20.04)"
dpkg-deb -x "$deb" "$tmp/deb-files"
needs=$(objdump -T "$tmp/deb-files/usr/bin/jobmgr" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
echo "/usr/bin/jobmgr needs glibc $needs"
[ "$(printf '%s\n2.28\n' "$needs" | sort -V | tail -1)" = 2.28 ] ||
    fail "the packaged binary needs glibc $needs, more than 2.28 (is packaging/build.sh still a cargo zigbuild?)"
libc6=$(dpkg-deb -f "$deb" Depends | sed -n 's/.*libc6 (>= \([0-9.]*\)).*/\1/p')
[ -n "$libc6" ] || fail "the deb does not depend on libc6 (>= VERSION)"
[ "$(printf '%s\n2.28\n' "$libc6" | sort -V | tail -1)" = 2.28 ] ||
    fail "the deb depends on libc6 >= $libc6, more than 2.28"

step "the packaged PHP runner is the binary's own"
"$tmp/deb-files/usr/bin/jobmgr" bwm-php-runner |
    cmp - "$tmp/deb-files/usr/share/jobmgr/bwm-php-runner.php" ||
    fail "/usr/share/jobmgr/bwm-php-runner.php differs from \`jobmgr bwm-php-runner\`"

step "rpm: metadata"
rpm -qip "$rpm"
for tag in NAME VERSION ARCH LICENSE SUMMARY; do
    [ -n "$(rpm -qp --queryformat "%{$tag}" "$rpm")" ] || fail "the rpm has no $tag"
done
rpm -qp --configfiles "$rpm" | grep -qx /etc/jobmgr/jobmgr.toml ||
    fail "/etc/jobmgr/jobmgr.toml is not a config file of the rpm"
rpm -qp --queryformat '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$rpm" |
    grep -q '^cn /etc/jobmgr/jobmgr.toml$' ||
    fail "the rpm's config file is not %config(noreplace)"
description=$(rpm -qp --queryformat '%{DESCRIPTION}' "$rpm")
[ "$description" != "$(rpm -qp --queryformat '%{SUMMARY}' "$rpm")" ] ||
    fail "the rpm's description is only its summary"
grep -q "long-polls a job server" <<<"$description" ||
    fail "the rpm's description is not packaging/description.txt: $description"
# The C library it asks for is the one the binary is linked against (2.28).
glibc_wanted=$(rpm -qpR "$rpm" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
echo "the rpm requires glibc $glibc_wanted"
[ -n "$glibc_wanted" ] || fail "the rpm does not require the C library"
[ "$(printf '%s\n2.28\n' "$glibc_wanted" | sort -V | tail -1)" = 2.28 ] ||
    fail "the rpm requires glibc $glibc_wanted, more than 2.28"

step "rpm: contents"
rpm -qlp "$rpm"
rpm_paths=$(rpm -qlp "$rpm")
for path in $files /usr/share/zsh/site-functions/_jobmgr; do
    grep -qx "$path" <<<"$rpm_paths" || fail "the rpm lacks $path"
done
for unit in $units; do
    grep -qx "/usr/lib/systemd/system/$unit" <<<"$rpm_paths" || fail "the rpm lacks the unit $unit"
done
# The rpm owns its directories (rpm -qf names it; erasing it removes them
# when empty), with the modes the service expects.
rpm_dirs=$(rpm -qp --queryformat '[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]' "$rpm")
for dir in "drwxr-xr-x root:root /etc/jobmgr" "drwxr-xr-x root:root /etc/jobmgr/conf.d" \
    "drwxr-xr-x root:root /etc/jobmgr/pools" "drwx--x--x root:root /var/lib/jobmgr"; do
    grep -qx "$dir" <<<"$rpm_dirs" || fail "the rpm does not own the directory: $dir"
done

step "rpm: installed into an empty root (rpm --root, without scriptlets)"
rpm --root "$tmp/rpm-root" --initdb
rpm --root "$tmp/rpm-root" -i --nodeps --noscripts "$rpm"
[ "$(stat -c %a "$tmp/rpm-root/var/lib/jobmgr")" = 711 ] || fail "the rpm's /var/lib/jobmgr is not mode 0711"
[ -d "$tmp/rpm-root/etc/jobmgr/conf.d" ] && [ -d "$tmp/rpm-root/etc/jobmgr/pools" ] ||
    fail "the rpm did not make /etc/jobmgr/conf.d and pools"
rpm --root "$tmp/rpm-root" -qf /etc/jobmgr/conf.d | grep -q '^jobmgr-' ||
    fail "/etc/jobmgr/conf.d does not belong to the rpm"
rpm --root "$tmp/rpm-root" -e --nodeps --noscripts jobmgr
[ ! -e "$tmp/rpm-root/etc/jobmgr/pools" ] || fail "erasing the rpm left its empty /etc/jobmgr/pools"
[ ! -e "$tmp/rpm-root/usr/bin/jobmgr" ] || fail "erasing the rpm left /usr/bin/jobmgr"
echo "rpm: installed and erased in $tmp/rpm-root"

step "maintainer scripts: sh -n"
dpkg-deb -e "$deb" "$tmp/control"
for script in postinst prerm postrm; do
    [ -x "$tmp/control/$script" ] || fail "the deb has no executable $script"
    sh -n "$tmp/control/$script"
    echo "deb $script: ok"
done
for tag in PREIN POSTIN PREUN POSTUN; do
    rpm -qp --queryformat "%{$tag}" "$rpm" >"$tmp/$tag.sh"
    [ -s "$tmp/$tag.sh" ] || fail "the rpm has no $tag scriptlet"
    sh -n "$tmp/$tag.sh"
    echo "rpm $tag: ok"
done

step "a throwaway Debian root"
# A pristine root is kept in target/ so that reruns skip the download.
base="$out/bookworm-root"
if [ ! -x "$base/usr/bin/systemd-analyze" ] || [ ! -x "$base/bin/kill" ]; then
    rm -rf --one-file-system "$base"
    debootstrap --variant=minbase --include=systemd,man-db,procps bookworm "$base.new" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$out/debootstrap.log" 2>&1 ||
        { tail -20 "$out/debootstrap.log"; fail "debootstrap failed"; }
    mv "$base.new" "$base"
fi
cp -a "$base" "$root"
mount -t proc proc "$root/proc"
in_root() { chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# systemd is not running in a chroot; the maintainer scripts see it as
# running (/run/systemd/system) and their systemctl calls are recorded.
mkdir -p "$root/run/systemd/system"
cat >"$root/usr/local/bin/systemctl" <<'SH'
#!/bin/sh
echo "$*" >>/var/log/systemctl.calls
SH
chmod 755 "$root/usr/local/bin/systemctl"
calls() { cat "$root/var/log/systemctl.calls" 2>/dev/null; : >"$root/var/log/systemctl.calls"; }

step "install"
cp "$deb" "$root/tmp/jobmgr.deb"
in_root dpkg -i /tmp/jobmgr.deb
in_root jobmgr --version | tee "$tmp/version"
grep -q "${version%%-*}" "$tmp/version" || fail "jobmgr --version does not say $version"
# check-config makes start's checks: the shipped worker path does not exist
# yet, so it refuses (as the service would); --offline: no server runs here.
if in_root jobmgr check-config --offline >/dev/null 2>"$tmp/refused"; then
    fail "check-config passed a worker path that does not exist"
fi
grep -q "pass an existing directory as --worker-path" "$tmp/refused" ||
    fail "check-config does not say the worker path is missing: $(cat "$tmp/refused")"
in_root install -d -m 0755 /srv/jobmgr/workers
in_root jobmgr check-config --offline | tee "$tmp/check-config"
grep -q '^worker-path = "/srv/jobmgr/workers" *# file /etc/jobmgr/jobmgr.toml' "$tmp/check-config" ||
    fail "check-config does not read /etc/jobmgr/jobmgr.toml"
in_root getent passwd jobmgr || fail "the jobmgr user was not created"
in_root getent group jobmgr || fail "the jobmgr group was not created"
[ "$(stat -c %a "$root/var/lib/jobmgr")" = 711 ] || fail "/var/lib/jobmgr is not mode 0711"
[ -d "$root/etc/jobmgr/conf.d" ] || fail "/etc/jobmgr/conf.d was not made"
[ -d "$root/etc/jobmgr/pools" ] || fail "/etc/jobmgr/pools was not made"
made=$(calls)
echo "systemctl: $made"
grep -qx daemon-reload <<<"$made" || fail "install did not reload systemd"
if grep -Eq 'start|enable' <<<"$made"; then fail "install started or enabled a service: $made"; fi

step "rpm %preun: erasing disables and stops the services, pool instances included"
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -s /lib/systemd/system/jobmgr@.service "$root/etc/systemd/system/multi-user.target.wants/jobmgr@example.service"
cp "$tmp/PREUN.sh" "$root/tmp/preun.sh"
in_root sh /tmp/preun.sh 1
made=$(calls)
[ -z "$made" ] || fail "%preun of an upgrade called systemctl: $made"
in_root sh /tmp/preun.sh 0
made=$(calls)
echo "systemctl: $made"
grep -qx -- "--no-reload disable jobmgr.service jobmgr-server.service jobmgr@example.service" <<<"$made" ||
    fail "%preun on erase did not disable the enabled jobmgr@ instance"
grep -qx "stop jobmgr.service jobmgr-server.service jobmgr@\*.service" <<<"$made" ||
    fail "%preun on erase did not stop the services"
rm "$root/etc/systemd/system/multi-user.target.wants/jobmgr@example.service"

step "systemd-analyze verify"
rm -rf "$root/run/systemd/system"
mv "$root/usr/local/bin/systemctl" "$tmp/systemctl"
cp "$root/usr/share/doc/jobmgr/examples/pool.toml" "$root/etc/jobmgr/pools/example.toml"
in_root systemd-analyze verify /lib/systemd/system/jobmgr.service \
    /lib/systemd/system/jobmgr-server.service jobmgr@example.service
echo "all three units verify"
mkdir -p "$root/run/systemd/system"
mv "$tmp/systemctl" "$root/usr/local/bin/systemctl"

step "a drop-in and an edited config survive an upgrade"
printf 'max-workers = 3\n' >"$root/etc/jobmgr/conf.d/10-fleet.toml"
printf '\n# edited by the operator\nmax-load = 7.5\n' >>"$root/etc/jobmgr/jobmgr.toml"
in_root jobmgr check-config --offline >"$tmp/check-config"
grep -q '^max-workers = 3 *# file /etc/jobmgr/conf.d/10-fleet.toml' "$tmp/check-config" ||
    fail "check-config does not read the conf.d drop-in"
# The site's drop-ins reach pool instances too, before the pool file.
printf 'kill-grace = "7s"\n' >"$root/etc/jobmgr/conf.d/20-site.toml"
mkdir -p "$root/srv/jobmgr/batch"
in_root jobmgr check-config --offline --config /etc/jobmgr/pools/example.toml >"$tmp/pool-config" ||
    fail "check-config refused the example pool file: $(cat "$tmp/pool-config")"
grep -q '^kill-grace = "7s" *# file /etc/jobmgr/conf.d/20-site.toml' "$tmp/pool-config" ||
    fail "a pool instance does not read /etc/jobmgr/conf.d: $(cat "$tmp/pool-config")"
grep -q '^max-workers = 2 *# file /etc/jobmgr/pools/example.toml' "$tmp/pool-config" ||
    fail "the pool file does not win over the site's drop-ins: $(cat "$tmp/pool-config")"
cp "$root/etc/jobmgr/jobmgr.toml" "$tmp/edited.toml"
cargo deb --no-build --no-strip --locked --deb-version "${version}+upgrade" --output "$tmp/upgrade.deb" >/dev/null
cp "$tmp/upgrade.deb" "$root/tmp/upgrade.deb"
in_root dpkg -i /tmp/upgrade.deb
cmp "$root/etc/jobmgr/jobmgr.toml" "$tmp/edited.toml" || fail "the upgrade overwrote the edited config"
[ -f "$root/etc/jobmgr/conf.d/10-fleet.toml" ] || fail "the upgrade removed a drop-in"
made=$(calls)
echo "systemctl: $made"
grep -qx -- "--no-block try-restart jobmgr.service jobmgr-server.service jobmgr@\*.service" <<<"$made" ||
    fail "the upgrade did not restart the running services gracefully"
if grep -q stop <<<"$made"; then fail "the upgrade stopped the services: $made"; fi

step "remove keeps config and state; purge removes them"
in_root dpkg -r jobmgr
made=$(calls)
echo "systemctl: $made"
grep -qx "stop jobmgr.service jobmgr-server.service jobmgr@\*.service" <<<"$made" ||
    fail "remove did not stop the services"
[ ! -e "$root/usr/bin/jobmgr" ] || fail "remove left /usr/bin/jobmgr"
[ -f "$root/etc/jobmgr/jobmgr.toml" ] || fail "remove deleted the config"
[ -d "$root/var/lib/jobmgr" ] || fail "remove deleted the state"
in_root dpkg -P jobmgr
[ ! -e "$root/etc/jobmgr/jobmgr.toml" ] || fail "purge left the config"
[ ! -e "$root/var/lib/jobmgr" ] || fail "purge left the state"
in_root getent passwd jobmgr >/dev/null || fail "purge removed the jobmgr user (policy keeps it)"

step "the units for real: boot systemd in a container (systemd-nspawn)"
if ! command -v systemd-nspawn >/dev/null; then
    echo "skipped: systemd-nspawn is absent here (apt install systemd-container)"
else
    boot="$tmp/boot"
    cp -a "$base" "$boot"
    cp "$deb" "$boot/tmp/jobmgr.deb"
    chroot "$boot" dpkg -i /tmp/jobmgr.deb >/dev/null
    install -m 755 packaging/boot-test.sh "$boot/usr/local/sbin/jobmgr-boot-test"
    cat >"$boot/etc/systemd/system/jobmgr-boot-test.service" <<'UNIT'
[Unit]
Description=jobmgr boot test
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/jobmgr-boot-test
UNIT
    mkdir -p "$boot/etc/systemd/system/default.target.wants"
    ln -s ../jobmgr-boot-test.service "$boot/etc/systemd/system/default.target.wants/"
    timeout 300 systemd-nspawn --quiet --register=no --keep-unit -D "$boot" -b \
        >"$out/boot.log" 2>&1 || true
    cat "$boot/boot-test.log" 2>/dev/null || { tail -30 "$out/boot.log"; fail "the container did not run the boot test"; }
    [ "$(cat "$boot/boot-test.result" 2>/dev/null)" = PASS ] || fail "the boot test failed (above; console in $out/boot.log)"
fi

step "an old distribution: Debian 11 (bullseye, glibc 2.31)"
# Kept in target/ like the bookworm root.
old="$out/bullseye-root"
if [ ! -x "$old/bin/kill" ]; then
    rm -rf --one-file-system "$old" "$old.new"
    debootstrap --variant=minbase --include=procps bullseye "$old.new" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$out/debootstrap-bullseye.log" 2>&1 ||
        { tail -20 "$out/debootstrap-bullseye.log"; fail "debootstrap bullseye failed"; }
    mv "$old.new" "$old"
fi
root="$tmp/bullseye"
cp -a "$old" "$root"
mount -t proc proc "$root/proc"
in_root ldd --version | sed -n 1p
cp "$deb" "$root/tmp/jobmgr.deb"
in_root dpkg -i /tmp/jobmgr.deb
in_root jobmgr --version | tee "$tmp/version"
grep -q "${version%%-*}" "$tmp/version" || fail "jobmgr --version does not run on bullseye"
mkdir -p "$root/srv/jobmgr/workers"
in_root jobmgr check-config --offline >/dev/null || fail "jobmgr check-config does not run on bullseye"
# A server started briefly, and a job created and read back through it.
mkdir -p "$root/tmp/server"
# setsid: the server leads a process group of its own (chroot and env exec
# into it), so that stopping the group stops the server itself, here or in
# the cleanup, and no server outlives the check.
setsid chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    jobmgr server --db /tmp/server/jobs.db --http 127.0.0.1:0 --bedrock none \
    >"$tmp/server.out" 2>"$tmp/server.err" &
server=$!
for _ in $(seq 300); do
    grep -q 'ready' "$tmp/server.out" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
addr=$(grep -o 'http=[^ ]*' "$tmp/server.out" | sed -n 1p | cut -d= -f2)
[ -n "$addr" ] || { stop_server; fail "the server did not start on bullseye: $(cat "$tmp/server.err")"; }
case "$addr" in *://*) ;; *) addr="http://$addr" ;; esac
job() { in_root jobmgr job "$@" --server "$addr" --token-file /tmp/server/token --format json; }
id=$(job create Hello --data '{"who":"bullseye"}' | grep -o '"jobID": *[0-9]*' | grep -o '[0-9]*$') ||
    { stop_server; fail "cannot create a job on bullseye"; }
job query "$id" | grep -q bullseye || { stop_server; fail "cannot read job $id back on bullseye"; }
stop_server
left=$(for p in /proc/[0-9]*; do [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && echo "${p#/proc/}"; done || true)
[ -z "$left" ] || fail "processes left running in the bullseye root after its server stopped: $left"
echo "bullseye: installed, --version, check-config, a server and job $id: ok"

step "packages ok: $(basename "$deb") $(basename "$rpm")"
