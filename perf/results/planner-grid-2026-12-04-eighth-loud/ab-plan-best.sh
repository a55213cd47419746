#!/bin/sh
# The two eighth-budget misses of the grid (2026-12-04), the plan against the grid's best point, paired:
# ROUNDS alternations (the order flipped every other round), each arm one pipetrain run of 4 + N steps,
# a line "ARM ROUND LOAD1 MEDIAN LEAST MOST" (ms, the measured steps). From the build directory:
#   sh ../perf/results/planner-grid-2026-12-04-eighth-loud/ab-plan-best.sh > ab.txt
BIN=${PIPETRAIN:-tools/pipetrain/pipetrain}
N=${N:-40}
D=784,128,128,128,128,128,128,128,128,128,128,128,128,10
U=784,512,512,512,512,512,10
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
pt() {
	tag=$1 w=$2
	shift 2
	"$BIN" --layers "$w" --batch 256 --limit $((256 * (N + 4))) --val 0 --epochs 1 --log "$WORK/log.csv" --quiet "$@" >/dev/null 2>"$WORK/err" ||
		{ echo "$tag FAIL $(cat "$WORK/err")"; return; }
	echo "$tag $(awk -F, 'NR > 5 { print $8 }' "$WORK/log.csv" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[1], v[NR] }')"
}
for r in $(seq 1 "${ROUNDS:-15}"); do
	l=$(cut -d' ' -f1 /proc/loadavg)
	if [ $((r % 2)) = 1 ]; then o="a b"; else o="b a"; fi
	for x in $o; do
		if [ "$x" = a ]; then pt "deep-plan-zbh1 $r $l" $D --stages 2 --threads 2 --schedule zbh1 --mb 16 --recompute none --hand-over off --split 5
		else pt "deep-best-1f1b $r $l" $D --stages 2 --threads 2 --schedule 1f1b --mb 16 --recompute none --hand-over off --split 5; fi
	done
	for x in $o; do
		if [ "$x" = a ]; then pt "uni-plan-zbh1 $r $l" $U --stages 2 --threads 2 --schedule zbh1 --mb 16 --recompute none --hand-over off --split 3
		else pt "uni-best-dpv $r $l" $U --stages 4 --threads 2 --schedule dualpipev --mb 16 --recompute none --hand-over off --split 1,3,4; fi
	done
done
