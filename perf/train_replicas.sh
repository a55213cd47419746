#!/bin/sh
# Issue 25's training target (perf/RESULTS.md): a training step under 1F1B on this 2-core machine, with a
# model whose one layer is about 70 % of the work (784,128,2560,10: layer 1 is 72 % of the products'
# flops), replicated plans against the best unreplicated partition, side by side in one run, and every
# replicated plan's weights byte for byte those of the unreplicated run. Not a test.
#
#   unreplicated: one stage on one thread (seq1); 1F1B on 2 stages and on 3 stages (on 2 threads), the
#                 split pipetrain's planner chooses;
#   replicated:   the whole model on 2 replicas (1 stage x 2), the planner's 2-stage split with its
#                 second stage on 2 replicas (1,2), and the 3-stage split with its middle layer on 2 (1,2,1:
#                 4 threads on 2 CPUs).
# Each arm trains one short epoch (--limit), the arms alternated ROUNDS times; samples/s medians per arm,
# and each median's ratio to the best unreplicated one. The weights of every arm after one epoch are
# compared (sha256) with the first arm's: a replicated plan that differs fails the run (exit 1).
#
# Usage (from the build directory): sh ../perf/train_replicas.sh [OUT_DIR]     (default: a temporary one)
# Environment: PIPETRAIN (binary; tools/pipetrain/pipetrain), MODEL (784,128,2560,10), ROUNDS (3),
#   LIMIT (8192), EXTRA (more options for every arm, e.g. "--batch 512 --mb 64"). A small proof run:
#   ROUNDS=1 LIMIT=1024 sh ../perf/train_replicas.sh
# Prints one summary line: "train_replicas: model=... unreplicated=ARM:SPS replicated=ARM:SPS x=R
# same_weights=yes others=O" (others: the CPU other processes took during the runs, perf/others.sh).
set -eu
BIN=${PIPETRAIN:-tools/pipetrain/pipetrain}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=perf/others.sh
. "$here/others.sh"
MODEL=${MODEL:-784,128,2560,10}
ROUNDS=${ROUNDS:-3}
LIMIT=${LIMIT:-8192}
EXTRA=${EXTRA:-}
command -v jq >/dev/null || { echo "train_replicas: jq not found (apt-get install jq)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "train_replicas: $BIN not built (make tools/pipetrain/pipetrain)" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
OUT=${1:-$WORK}
mkdir -p "$OUT"
echo "train_replicas: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at start, model $MODEL"
# name:options; the first three unreplicated, the others replicated
set -- "seq1:--stages 1 --threads 1" "1f1b-s2:--stages 2" "1f1b-s3:--stages 3" \
	"1f1b-s1-r2:--stages 1 --replicas 2" "1f1b-s2-r1-2:--stages 2 --replicas 1,2" \
	"1f1b-s3-r1-2-1:--stages 3 --replicas 1,2,1"
csv=$OUT/train-replicas.csv
echo "arm,round,samples_per_s,bubble,others,sha256" >"$csv"
others_sum=0
for r in $(seq 1 "$ROUNDS"); do
	for arm in "$@"; do
		name=${arm%%:*} args=${arm#*:}
		# shellcheck disable=SC2086 # args and EXTRA are lists of options
		others_run "$BIN" --layers "$MODEL" --limit "$LIMIT" --epochs 1 --val 1000 --schedule 1f1b $args $EXTRA \
			--save "$WORK/w.safetensors" --json --quiet >"$WORK/t.json"
		others_sum=$(awk -v a="$others_sum" -v b="$OTHERS" 'BEGIN { print a + b }')
		echo "$name,$r,$(jq -r '.epochs[0] | "\(.samples_per_s),\(.bubble)"' "$WORK/t.json"),$OTHERS,$(sha256sum <"$WORK/w.safetensors" | cut -c1-16)" >>"$csv"
	done
done
cat "$csv"
# shellcheck disable=SC2016 # an awk program
median='{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
best_u='' best_u_sps=0 best_r='' best_r_sps=0 k=0
echo "arm,median_samples_per_s"
for arm in "$@"; do
	name=${arm%%:*} k=$((k + 1))
	med=$(awk -F, -v a="$name" '$1 == a { print $3 }' "$csv" | sort -g | awk "$median")
	echo "$name,$med"
	if [ "$k" -le 3 ]; then
		if awk -v m="$med" -v b="$best_u_sps" 'BEGIN { exit !(m > b) }'; then best_u=$name best_u_sps=$med; fi
	elif awk -v m="$med" -v b="$best_r_sps" 'BEGIN { exit !(m > b) }'; then
		best_r=$name best_r_sps=$med
	fi
done
same=$(awk -F, 'NR > 1 { h[$6] = 1 } END { n = 0; for (x in h) n++; print n == 1 ? "yes" : "no" }' "$csv")
echo "train_replicas: model=$MODEL unreplicated=$best_u:$best_u_sps replicated=$best_r:$best_r_sps" \
	"x=$(awk -v a="$best_r_sps" -v b="$best_u_sps" 'BEGIN { printf "%.2f", a / b }') same_weights=$same" \
	"others=$(awk -v s="$others_sum" -v n="$ROUNDS" -v a="$#" 'BEGIN { printf "%.2f", s / (n * a) }')"
[ "$same" = yes ]
