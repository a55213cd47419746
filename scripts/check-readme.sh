#!/usr/bin/env bash
# Run every command of README.md as written, so that the README stays true (scripts/test.sh runs this).
#
#   scripts/check-readme.sh [BUILD_DIR]      BUILD_DIR: an already configured build to stand for `build/`
#
# What counts as a command: every line of an indented code block (four spaces) in README.md. Each block
# runs as one bash script (so `export`, `&` and `kill %1` work as they would for a reader typing them),
# stopping at the first line that fails, in a copy of the source tree with HOME pointing to an empty
# directory (so `prefix=$HOME/.local` and the like touch nothing outside) and, where `unshare -n` works, in
# a network namespace of its own (so a server on a fixed port meets no other). The copy's `build/` is
# BUILD_DIR when given, so the build is not done twice.
#
# Lines are run as they are, with these exceptions, because running them here is impossible or circular:
#   - `./scripts/test.sh ...` (this script's caller): checked with `bash -n` and for a mode test.sh knows.
#   - a line ending in `&` starts a background job; the next line is retried for up to 30 s until it
#     succeeds (a reader would wait for the server to print its address), and every background job must
#     exit with status 0 at the end of its block (after the block's own `kill`).
# curl runs with --fail (from $HOME/.curlrc), so an HTTP error status fails its line.
#
# Adding a command to the README needs nothing here: put it in an indented block. A command that cannot run
# in CI (needs a terminal, a GPU, the network) belongs in prose as `inline code`, or needs a case below.
# shellcheck disable=SC2016 # the single-quoted text is the generated scripts' code, expanded there
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-}
readme="$top/README.md"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
copy="$work/src"
mkdir -p "$copy" "$work/home"
# the tree as a reader has it: tracked files and new ones, not builds or git metadata
(cd "$top" && tar --exclude='./build*' --exclude='./.git' --exclude='./autom4te.cache' -cf - .) |
	(cd "$copy" && tar -xf -)
if [ -n "$build" ]; then
	ln -s "$(cd "$build" && pwd)" "$copy/build"
fi
echo "--fail" >"$work/home/.curlrc"

# Extract the blocks: one file per block, one command per line.
awk -v dir="$work" '
	/^    [^ ]/ && (prev_blank || inblock) {
		if (!inblock) { n++; inblock = 1 }
		print substr($0, 5) > (dir "/block" n ".txt")
		prev_blank = 0
		next
	}
	{ inblock = 0; prev_blank = ($0 ~ /^[ \t]*$/) }
' "$readme"

# Turn a block into a bash script that reports the failing line.
make_script() {
	local txt=$1 retry=0 line cmd
	echo 'set -uo pipefail'
	echo 'bg=()'
	echo 'fail() { echo "check-readme: FAILED: $1" >&2; for p in "${bg[@]}"; do kill "$p" 2>/dev/null; done; exit 1; }'
	while IFS= read -r line; do
		cmd=$(printf '%s' "$line" | sed -E 's/[[:space:]]+#[[:space:]].*$//')
		[ -n "$cmd" ] || continue
		printf 'echo %q\n' "\$ $line"
		case "$cmd" in
		./scripts/test.sh*)
			printf 'bash -n scripts/test.sh || fail %q\n' "$line"
			printf 'm=$(set -- %s; echo "${2:-default}"); grep -q -- "^$m)" scripts/test.sh || fail %q\n' \
				"$cmd" "$line"
			continue
			;;
		esac
		if [[ $cmd == *'&' ]]; then
			printf '%s\n' "$cmd"
			echo 'bg+=($!)'
			retry=1
			continue
		fi
		if [ $retry = 1 ]; then
			printf 'ok=0; for i in $(seq 300); do if { %s; }; then ok=1; break; fi; sleep 0.1; done\n' "$cmd"
			printf '[ $ok = 1 ] || fail %q\n' "$line"
			retry=0
			continue
		fi
		printf '{ %s; } || fail %q\n' "$cmd" "$line"
	done <"$txt"
	echo 'for p in "${bg[@]}"; do wait "$p" || fail "background job $p exited with status $?"; done'
	echo 'exit 0'
}

isolate=()
if unshare -n true 2>/dev/null; then
	isolate=(unshare -n)
fi

status=0
n=0
while [ -f "$work/block$((n + 1)).txt" ]; do
	n=$((n + 1))
	txt="$work/block$n.txt"
	make_script "$txt" >"${txt%.txt}.sh"
	echo "check-readme: block $n: $(head -n 1 "$txt")"
	if [ ${#isolate[@]} -gt 0 ]; then
		runner=("${isolate[@]}" bash -c 'ip link set lo up 2>/dev/null; exec bash "$0"' "${txt%.txt}.sh")
	else
		runner=(bash "${txt%.txt}.sh")
	fi
	if ! (cd "$copy" && HOME="$work/home" timeout 900 "${runner[@]}" </dev/null >"${txt%.txt}.log" 2>&1); then
		cat "${txt%.txt}.log" >&2
		status=1
	elif [ -n "${CHECK_README_VERBOSE:-}" ]; then
		cat "${txt%.txt}.log"
	fi
done
[ $status = 0 ] && echo "check-readme: every README command ran"
exit $status
