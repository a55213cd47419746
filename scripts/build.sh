#!/usr/bin/env bash
# Configure and build mbpipe out of tree: scripts/build.sh BUILD_DIR [configure options...]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: scripts/build.sh BUILD_DIR [configure options]}
shift
[ -x "$top/configure" ] || (cd "$top" && autoreconf -fi >/dev/null)
mkdir -p "$dir"
cd "$dir"
[ -f Makefile ] || "$top/configure" -q "$@"
make -j"$(nproc)" >/dev/null
