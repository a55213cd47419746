#!/usr/bin/env bash
# Run pipebench's default demo several times in a row and report the chosen micro-batch sizes and their
# spread: does the tool give the same answer twice? (issue 15)
#
#   perf/pipebench_repeat.sh [BUILD_DIR [RUNS [PIPEBENCH ARGS...]]]      (defaults: build, 5, none)
#
# Per run: the chosen size, the sizes the tool reported tied with the fastest, the speed-up, the noise
# verdict and the consistency checks from the summary line, how much of the CPUs other processes used
# before and while it measured, and the wall time. Then the spread: the distinct sizes chosen, and in how
# many runs the answer agrees with the most frequent one (the same size, or one that run reported as tied
# with it). Exit status 1 when a run failed or printed flagged figures.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build}
runs=${2:-5}
shift $(($# < 2 ? $# : 2))
bin=$build/tools/pipebench/pipebench
[ -x "$bin" ] || { echo "pipebench_repeat: $bin not built (scripts/build.sh $build)" >&2; exit 2; }

echo "pipebench_repeat: $runs runs of: pipebench $* (no Gantt chart)"
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(uptime | sed 's/.*load/load/')"
printf '%-4s %-7s %-22s %-8s %-6s %-8s %-26s %-26s %s\n' run chosen tied speedup noise checks \
	"others before (CPUs)" "others during (avg/max)" wall_s
declare -a chosen tied
status=0
for i in $(seq 1 "$runs"); do
	t0=$(date +%s.%N)
	if ! out=$("$bin" --no-gantt --no-progress "$@" 2>&1); then
		status=1
	fi
	t1=$(date +%s.%N)
	[ "$i" != 1 ] || printf '%s\n' "$out" | grep -m1 '^BLAS: ' || true
	sum=$(printf '%s\n' "$out" | grep '^pipebench: workload=' || true)
	key() { printf '%s\n' "$sum" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
	chosen[$i]=$(key best_mb)
	tied[$i]=$(key tied)
	before=$(printf '%s\n' "$out" | sed -n 's/^machine: before measuring, other processes used \([0-9.]*\) of .*steal \([0-9.]*\)), load average \([0-9.]*\): \([A-Za-z]*\).*/\1 (load \3, \4)/p')
	during=$(printf '%s\n' "$out" | sed -n 's/^machine: while measuring, other processes used \([0-9.]*\) CPUs on average .*at most \([0-9.]*\) in a window), \([0-9]*\) of \([0-9]*\) windows* loud.*/\1\/\2, \3 of \4 loud/p')
	[ "$(key checks)" = ok ] || status=1
	[ "$(key status)" = ok ] || status=1
	printf '%-4s %-7s %-22s %-8s %-6s %-8s %-26s %-26s %.1f\n' "$i" "${chosen[$i]:-?}" "${tied[$i]:-?}" \
		"$(key speedup)" "$(key noise)" "$(key checks)" "${before:-?}" "${during:-?}" \
		"$(echo "$t1 - $t0" | bc)"
	if [ "$(key checks)" != ok ]; then
		printf '%s\n' "$out" | grep '^check m=' | sed "s/^/    run $i: /"
	fi
done

# the most frequent answer, and the runs that agree with it
mode=$(for i in $(seq 1 "$runs"); do echo "${chosen[$i]}"; done | sort | uniq -c | sort -k1,1nr -k2,2n |
	awk 'NR == 1 { print $2 }')
agree=0
for i in $(seq 1 "$runs"); do
	if [ "${chosen[$i]}" = "$mode" ] || [[ ",${tied[$i]}," == *",$mode,"* ]]; then
		agree=$((agree + 1))
	fi
done
distinct=$(for i in $(seq 1 "$runs"); do echo "${chosen[$i]}"; done | sort -n | uniq | paste -sd, -)
echo "pipebench_repeat: runs=$runs chosen=$(for i in $(seq 1 "$runs"); do printf '%s ' "${chosen[$i]}"; done |
	sed 's/ $//' | tr ' ' ,) distinct=$distinct mode=$mode agree=$agree/$runs status=$([ $status = 0 ] && echo ok || echo fail)"
exit $status
