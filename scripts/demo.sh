#!/usr/bin/env bash
# The main job: install what is missing, build, and run the pipebench demo (an MLP split into as many
# pipeline stages as this process may use CPUs, at most 4; a sweep of micro-batch sizes; the chosen size
# and a Gantt chart). Extra arguments go to pipebench (try --help).
#
# The build leaves its load on the CPUs for a moment (and other users may be at work): pipebench samples
# what other processes take of the CPUs and waits for them to settle, at most --wait-quiet seconds
# (default 30), before it measures; it then says how loud the machine was, and flags rows measured
# while it was loud.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/deps.sh"
"$top/scripts/build.sh" "$top/build"
echo "demo: built; pipebench waits for the machine to settle (at most 30 s) before it measures" >&2
exec "$top/build/tools/pipebench/pipebench" "$@"
