#!/usr/bin/env bash
# The main job: install what is missing, build, and run the pipebench demo (an MLP split into as many
# pipeline stages as this process may use CPUs, at most 4; a sweep of micro-batch sizes; the chosen size
# and a Gantt chart). Extra arguments go to pipebench (try --help).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/deps.sh"
"$top/scripts/build.sh" "$top/build"
exec "$top/build/tools/pipebench/pipebench" "$@"
