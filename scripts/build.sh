#!/usr/bin/env bash
# Configure and build mbpipe out of tree: scripts/build.sh BUILD_DIR [configure options...]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: scripts/build.sh BUILD_DIR [configure options: --enable-werror --enable-asan --enable-tsan --enable-debug ...]"
case "${1:-}" in
-h | --help)
	echo "$usage"
	exit 0
	;;
"" | -*)
	echo "$usage" >&2
	exit 2
	;;
esac
dir=$1
shift
[ -x "$top/configure" ] || (cd "$top" && autoreconf -fi >/dev/null)
mkdir -p "$dir"
cd "$dir"
[ -f Makefile ] || "$top/configure" -q "$@"
make -j"$(nproc)" >/dev/null
