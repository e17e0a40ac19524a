#!/usr/bin/env bash
# Builds the deb and rpm packages into target/packaging/: the release binary
# (stripped), its shell completions and man page, then `cargo deb` and
# `cargo generate-rpm` with the metadata in Cargo.toml. Needs cargo-deb and
# cargo-generate-rpm (`cargo install cargo-deb cargo-generate-rpm`).
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/packaging
cargo build --release --locked
mkdir -p "$out"
strip -o "$out/jobmgr" target/release/jobmgr
"$out/jobmgr" completions bash >"$out/jobmgr.bash"
"$out/jobmgr" completions zsh >"$out/_jobmgr"
"$out/jobmgr" completions fish >"$out/jobmgr.fish"
"$out/jobmgr" man | gzip -9n >"$out/jobmgr.1.gz"

rm -f "$out"/*.deb "$out"/*.rpm
cargo deb --no-build --no-strip --locked --output "$out/" "$@"
cargo generate-rpm --output "$out/"
ls -l "$out"/*.deb "$out"/*.rpm
