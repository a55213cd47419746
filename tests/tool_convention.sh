#!/bin/sh
# The one convention of the three tools (pipebench, pipeserve, pipetrain), checked on the built tools and
# their manual pages:
#   -h and --help print the same usage on standard output, nothing on standard error, exit 0;
#   -V and --version print the one line "NAME (mbpipe) VERSION" on standard output, exit 0;
#   an unknown option and a bad value give one line "NAME: reason" on standard error, nothing on standard
#   output, exit 2;
#   the OPTIONS section of NAME.1 lists exactly the options --help lists, long and short, both ways (an
#   option of the manual page is a tag of its OPTIONS section; one of --help, any --name or lone -x in it).
# Usage: tests/tool_convention.sh [TOOL...] (default: the three), run by `make check` from the build
# directory; srcdir names the source tree (where the manual pages are). Prints one line per failure.
set -u
src=${srcdir:-$(dirname "$0")/..}
[ $# -gt 0 ] || set -- pipebench pipeserve pipetrain
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
fail() {
	echo "FAIL $tool: $*"
	status=1
}

# The options named in a text on standard input, one a line, sorted: --long-name and lone -x.
names() {
	sed 's/\\-/-/g; s/\\f[BIRP]//g' | tr -c 'A-Za-z0-9=_-' ' ' | tr ' ' '\n' |
		sed -n -E 's/^(--[A-Za-z][A-Za-z0-9-]*).*/\1/p; s/^(-[A-Za-z])$/\1/p' | sort -u
}

for tool in "$@"; do
	bin=tools/$tool/$tool
	man=$src/tools/$tool/$tool.1
	[ -x "$bin" ] || { fail "$bin not built"; continue; }
	[ -r "$man" ] || { fail "$man not found"; continue; }

	# --help and -h
	for flag in --help -h; do
		"$bin" "$flag" >"$tmp/out$flag" 2>"$tmp/err"
		rc=$?
		[ "$rc" -eq 0 ] || fail "$flag: exit $rc, not 0 ($(head -c 200 "$tmp/err"))"
		[ -s "$tmp/out$flag" ] || fail "$flag: nothing on standard output"
		[ ! -s "$tmp/err" ] || fail "$flag: standard error not empty: $(head -c 200 "$tmp/err")"
	done
	cmp -s "$tmp/out--help" "$tmp/out-h" || fail "-h and --help print different texts"

	# --version and -V
	for flag in --version -V; do
		out=$("$bin" "$flag" 2>"$tmp/err")
		rc=$?
		[ "$rc" -eq 0 ] || fail "$flag: exit $rc, not 0 ($(head -c 200 "$tmp/err"))"
		printf '%s\n' "$out" | grep -q -x -E "$tool \(mbpipe\) [0-9][0-9A-Za-z.+~-]*" ||
			fail "$flag: '$out', not '$tool (mbpipe) VERSION'"
		[ ! -s "$tmp/err" ] || fail "$flag: standard error not empty: $(head -c 200 "$tmp/err")"
	done

	# a bad flag and a bad value: one line, exit 2
	for args in "--no-such-option" "--stages not-a-number"; do
		# shellcheck disable=SC2086 # args is a list of words
		"$bin" $args >"$tmp/out" 2>"$tmp/err" </dev/null
		rc=$?
		[ "$rc" -eq 2 ] || fail "$args: exit $rc, not 2"
		[ ! -s "$tmp/out" ] || fail "$args: standard output not empty: $(head -c 200 "$tmp/out")"
		if [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q "^$tool: " "$tmp/err"; then
			fail "$args: not one line '$tool: reason' on standard error: $(head -c 300 "$tmp/err")"
		fi
	done

	# the options of --help against those of the manual page, both ways
	names <"$tmp/out--help" >"$tmp/help"
	awk '/^\.SH/ { in_opts = ($2 == "OPTIONS") } in_opts && tag { print } { tag = ($0 == ".TP") }' "$man" |
		names >"$tmp/man"
	[ -s "$tmp/man" ] || fail "$man: no options in its OPTIONS section"
	only_help=$(comm -23 "$tmp/help" "$tmp/man" | tr '\n' ' ')
	only_man=$(comm -13 "$tmp/help" "$tmp/man" | tr '\n' ' ')
	[ -z "$only_help" ] || fail "in --help, not in the OPTIONS of $tool.1: $only_help"
	[ -z "$only_man" ] || fail "in the OPTIONS of $tool.1, not in --help: $only_man"
done
exit $status
