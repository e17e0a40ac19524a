#!/usr/bin/env bash
# Builds the deb and rpm packages into target/packaging/: the release binary
# (stripped), its shell completions and man page, then `cargo deb` with the
# metadata in Cargo.toml and `rpmbuild` with packaging/rpm/jobmgr.spec. Needs
# cargo-deb (`cargo install cargo-deb`), rpmbuild (Debian's `rpm` package),
# and cargo-zigbuild with zig (see below).
#
# The packaged binary is linked against glibc 2.28 (`cargo zigbuild`, with
# zig as the linker and C compiler for rusqlite's SQLite and ring), so that
# it runs on RHEL/Alma/Rocky 8, Debian 11 and Ubuntu 20.04 and newer, not
# only on systems as new as the build machine. It refuses a binary that
# needs a newer glibc.
#
# `packaging/build.sh --binary` builds the release binary only (CI starts
# it early, in the background; the full run then finds it built).
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/packaging
glibc=2.28
target="$(uname -m)-unknown-linux-gnu"

# cargo-zigbuild and zig from a venv under target/ (.ci/run makes it:
# `python3 -m venv target/zig-venv && target/zig-venv/bin/pip install
# cargo-zigbuild==0.24.0 ziglang==0.17.1`), else from PATH.
if [ -x target/zig-venv/bin/cargo-zigbuild ]; then
    export PATH="$PWD/target/zig-venv/bin:$PATH"
fi
command -v cargo-zigbuild >/dev/null || {
    echo "packaging/build.sh: cargo-zigbuild is missing; run:" >&2
    echo "  python3 -m venv target/zig-venv && target/zig-venv/bin/pip install cargo-zigbuild==0.24.0 ziglang==0.17.1" >&2
    exit 1
}

# Without the release profile's debug info (`debug = 1`, for profiling a
# local build): the packaged binary is stripped of it anyway.
CARGO_PROFILE_RELEASE_DEBUG=0 cargo zigbuild --release --locked --target "$target.$glibc"
bin="target/$target/release/jobmgr"
needs=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
if [ "$(printf '%s\n%s\n' "$needs" "$glibc" | sort -V | tail -1)" != "$glibc" ]; then
    echo "packaging/build.sh: $bin needs glibc $needs, more than $glibc" >&2
    exit 1
fi
echo "$bin needs glibc $needs (at most $glibc)"
if [ "${1:-}" = --binary ]; then
    exit 0
fi

mkdir -p "$out"
strip -o "$out/jobmgr" "$bin"
"$out/jobmgr" completions bash >"$out/jobmgr.bash"
"$out/jobmgr" completions zsh >"$out/_jobmgr"
"$out/jobmgr" completions fish >"$out/jobmgr.fish"
"$out/jobmgr" man | gzip -9n >"$out/jobmgr.1.gz"
"$out/jobmgr" bwm-php-runner >"$out/bwm-php-runner.php"

rm -f "$out"/*.deb "$out"/*.rpm
cargo deb --no-build --no-strip --locked --output "$out/" "$@"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | sed -n 1p)
rpmtop=$(mktemp -d)
trap 'rm -rf "$rpmtop"' EXIT
rpmbuild -bb --quiet packaging/rpm/jobmgr.spec \
    --define "_topdir $rpmtop" --define "_sourcedir $PWD" --define "_rpmdir $rpmtop/rpms" \
    --define "version $version" --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm"
mv "$rpmtop"/rpms/jobmgr-*.rpm "$out/"
ls -l "$out"/*.deb "$out"/*.rpm
