#!/bin/sh
# Two builds of mbpipe side by side: one benchmark run from each build in turn, ROUNDS rounds (the side
# that goes first alternates), then, per metric, each side's median and the median and range of the
# rounds' paired ratios B/A (a slow moment of the machine touches both runs of a round).
#
#   perf/ab.sh [-i IDKEYS] -m METRICS A_BUILD B_BUILD ROUNDS COMMAND [ARGS...]
#   perf/ab.sh [-i IDKEYS] -m METRICS A_BINARY B_BINARY ROUNDS [ARGS...]
#
# With build directories, COMMAND is a path inside one (perf/bench_ring, tools/pipebench/pipebench) or,
# for a run under mpirun, `mpirun ... perf/bench_mpi ...`: every word that names a file of A_BUILD is run
# from each build in turn. With two programs (the same bench linked against two libraries, say), each is
# run with ARGS. AB_LOG=FILE appends every run's whole output to FILE. The metrics come from the benchmark's grep-able summary lines (words KEY=VALUE): METRICS
# is a comma-separated list of keys; where a command prints several summary lines (one per configuration,
# as bench_pipeline does), IDKEYS names the keys that tell the lines apart (e.g. S,W_us). "others" is the
# CPU that other processes took during each run (busy jiffies of /proc/stat minus the run's own, over its
# wall time; 0 on a quiet machine). Exits 1 when a run fails.
#
# Example (issue 21's "no speed lost" table: old main against new):
#   perf/ab.sh -m mbpipe_mops,ratio,idle_cpu_pct /tmp/old/build build 5 perf/bench_ring -r 3
set -eu
ids='' metrics=''
while getopts i:m: o; do
	case $o in
	i) ids=$OPTARG ;;
	m) metrics=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -lt 3 ] || [ -z "$metrics" ]; then
	echo "usage: perf/ab.sh [-i IDKEYS] -m METRICS A_BUILD B_BUILD ROUNDS COMMAND [ARGS...]" >&2
	exit 2
fi
a=$1 b=$2 rounds=$3
shift 3
for d in "$a" "$b"; do
	[ -d "$d" ] || [ -x "$d" ] || { echo "ab: $d is neither a build directory nor a program" >&2; exit 2; }
done
[ -d "$a" ] && [ $# -eq 0 ] && { echo "ab: no command to run in $a" >&2; exit 2; }
tmp=$(mktemp -d /tmp/ab.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=perf/others.sh
. "$(dirname "$0")/others.sh"

# run SIDE DIR ROUND: the command with every word naming a file of A_BUILD taken from DIR instead.
run() {
	side=$1 dir=$2 r=$3
	set --
	[ -d "$dir" ] || set -- "$dir"
	for w in $cmd; do
		if [ -d "$a" ] && [ -e "$a/$w" ]; then set -- "$@" "$dir/$w"; else set -- "$@" "$w"; fi
	done
	if ! others_run "$@" >"$tmp/out" 2>&1; then
		echo "ab: $side round $r failed: $*" >&2
		tail -5 "$tmp/out" >&2
		exit 1
	fi
	others=$OTHERS
	[ -z "${AB_LOG:-}" ] || printf '== %s round %s (%s) %s\n%s\n' "$side" "$r" "$*" "$(date -u +%T)" \
		"$(cat "$tmp/out")" >>"$AB_LOG"
	# one record per summary line: SIDE ROUND ID KEY VALUE
	awk -v side="$side" -v r="$r" -v ids=",$ids," -v metrics=",$metrics," -v others="$others" '
	/^[a-z_0-9]+:? .*=/ {
		id = ""; n = 0
		for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2 && index(ids, "," kv[1] ",")) id = id (id == "" ? "" : ",") $i
		for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2 && index(metrics, "," kv[1] ",") && kv[2] ~ /^-?[0-9.]+$/) {
			print side, r, (id == "" ? "-" : id), kv[1], kv[2]; n++
		}
		if (n) print side, r, (id == "" ? "-" : id), "others", others
	}' "$tmp/out" >>"$tmp/rec"
	echo "round $r $side: others $others CPUs" >&2
}

cmd=$*
echo "ab: A=$a B=$b rounds=$rounds: $cmd"
echo "ab: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(uptime | sed 's/.*load/load/')"
: >"$tmp/rec"
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) -eq 1 ]; then run A "$a" "$r"; run B "$b" "$r"; else run B "$b" "$r"; run A "$a" "$r"; fi
done
[ -s "$tmp/rec" ] || { echo "ab: no summary line carried the metrics $metrics" >&2; exit 1; }
sort -k3,3 -k4,4 -k2,2n -k1,1 "$tmp/rec" | awk '
function med(arr, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
	return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2
}
# "median [min..max]" of the n values in arr (sorted by med)
function cell(arr, n,   m) { m = med(arr, n); return sprintf("%.4g [%.4g..%.4g]", m, arr[1], arr[n]) }
function flush(   na, nb, nr, i, ra) {
	if (key == "") return
	na = nb = nr = 0
	for (i in A) { na++; xa[na] = A[i] }
	for (i in B) { nb++; xb[nb] = B[i] }
	for (i in A) if ((i in B) && A[i] != 0) { nr++; xr[nr] = B[i] / A[i] }
	ra = nr && k != "others" ? cell(xr, nr) : "-"
	printf "%-20s %-16s %-28s %-28s %s\n", id, k, cell(xa, na), cell(xb, nb), ra
	delete A; delete B; delete xa; delete xb; delete xr
}
BEGIN { printf "%-20s %-16s %-28s %-28s %s\n", "config", "metric", "A median [min..max]", "B median [min..max]", "B/A paired: median [min..max]" }
{ if ($3 SUBSEP $4 != key) { flush(); key = $3 SUBSEP $4; id = $3; k = $4 } if ($1 == "A") A[$2] = $5; else B[$2] = $5 }
END { flush() }'
