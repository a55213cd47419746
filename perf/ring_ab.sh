#!/bin/sh
# Alternate two builds of perf/bench_ring (the same bench source, say, linked once against main's ring and
# once against this tree's) RUNS times each, A B B A A B ..., on the same rows and options, and summarise
# each build's summary keys over its runs: median [min .. max]. See perf/results/ring.md.
# Usage: perf/ring_ab.sh A_BINARY B_BINARY RUNS [bench_ring options...]
# RING_AB_LOG=FILE: append every run's whole output (its table) to FILE too.
set -eu
[ $# -ge 3 ] || { echo "usage: ring_ab.sh A_BINARY B_BINARY RUNS [bench_ring options...]" >&2; exit 2; }
a=$1 b=$2 runs=$3
shift 3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
i=0
while [ "$i" -lt "$runs" ]; do
	if [ $((i % 2)) -eq 0 ]; then order="A B"; else order="B A"; fi
	for side in $order; do
		if [ "$side" = A ]; then bin=$a; else bin=$b; fi
		full=$("$bin" "$@" 2>/dev/null) || { echo "ring_ab.sh: $bin failed" >&2; exit 1; }
		[ -z "${RING_AB_LOG:-}" ] || printf '== %s (%s) %s\n%s\n' "$side" "$bin" "$(date -u +%T)" "$full" >>"$RING_AB_LOG"
		line=$(printf '%s\n' "$full" | grep '^bench_ring: mbpipe_mops=')
		echo "$side $(uptime | sed 's/.*load average: \([0-9.]*\).*/load=\1/') ${line#bench_ring: }" | tee -a "$out"
	done
	i=$((i + 1))
done
for side in A B; do
	for key in mbpipe_steady steady_peer steady_ratio mbpipe_mops best_peer_mops ratio idle_cpu_pct; do
		grep "^$side " "$out" | tr ' ' '\n' | sed -n "s/^$key=//p" | sort -g |
			awk -v s="$side" -v k="$key" '{ v[NR] = $1 } END {
				m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
				printf "%s %-15s median %8.3f  [%.3f .. %.3f]  (%d runs)\n", s, k, m, v[1], v[NR], NR }'
	done
done
