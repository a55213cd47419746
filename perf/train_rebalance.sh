#!/bin/sh
# Issue 25's rebalancing target under training (perf/RESULTS.md): a 2-stage pipetrain run whose stage
# costs change from 1:1 to 1:3 in the middle, with and without --rebalance, beside a run at the split the
# rebalancing ended with from the start (the fresh plan for the new costs). Not a test.
#
# The change is real time: PIPETRAIN_SLOW=STEP:LAYER:US makes the stage that holds the last layer spin US
# microseconds more in each forward from step STEP on; US is twice stage 1's profiled cost a micro-batch
# (read from a first run), so stage 1 goes from about its share to about three times it. Each arm writes a
# row per step (--log); the steps/s of an arm is the median over the last half of the steps after the
# change. The moves' lines say after which step each came; its log row says when.
#
#   static:    the profiled split, no --rebalance;
#   rebalance: the same with --rebalance (its defaults: a look every 4 steps, patience 2);
#   fresh:     --split at the split the rebalancing run ended with, the slow layer slow from step 0.
#
# Usage (from the build directory): sh ../perf/train_rebalance.sh [OUT_DIR]   (default: a temporary one)
# Environment: PIPETRAIN (binary; tools/pipetrain/pipetrain), MODEL (784,256,256,256,256,10), LIMIT
#   (16384), BATCH (256), EPOCHS (2: the change at the start of the second), EXTRA (more options for
#   every arm). A small proof run: LIMIT=2048 sh ../perf/train_rebalance.sh
# Prints one summary line: "train_rebalance: model=... static=SPS rebalance=SPS fresh=SPS x=R (rebalance
# / fresh) moves=N move_s=S (the first move's time after the change) same_weights=yes others=O", and
# exits 1 when the weights of the three arms differ or the rebalancing run did not move.
set -eu
BIN=${PIPETRAIN:-tools/pipetrain/pipetrain}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=perf/others.sh
. "$here/others.sh"
MODEL=${MODEL:-784,256,256,256,256,10}
LIMIT=${LIMIT:-16384}
BATCH=${BATCH:-256}
EPOCHS=${EPOCHS:-2}
EXTRA=${EXTRA:-}
command -v jq >/dev/null || { echo "train_rebalance: jq not found (apt-get install jq)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "train_rebalance: $BIN not built (make tools/pipetrain/pipetrain)" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
OUT=${1:-$WORK}
mkdir -p "$OUT"
layers=$(echo "$MODEL" | awk -F, '{ print NF - 1 }')
spe=$((LIMIT / BATCH))
switch=$((spe * EPOCHS / 2))
common="--layers $MODEL --limit $LIMIT --batch $BATCH --mb 32 --val 500 --epochs $EPOCHS --stages 2 --quiet"
echo "train_rebalance: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at start, model $MODEL," \
	"$((spe * EPOCHS)) steps, the change after step $switch"
# shellcheck disable=SC2086 # common and EXTRA are lists of options
"$BIN" $common $EXTRA --epochs 1 --limit "$BATCH" --json >"$WORK/probe.json"
us=$(jq -r '.stages[1].profiled_us * 2' "$WORK/probe.json")
slow="$switch:$((layers - 1)):$us"
echo "train_rebalance: PIPETRAIN_SLOW=$slow (stage 1 profiled $(jq -r '.stages[1].profiled_us' "$WORK/probe.json") us a micro-batch)"
others_sum=0
arm() { # name, PIPETRAIN_SLOW, options...
	name=$1 sl=$2
	shift 2
	PIPETRAIN_SLOW=$sl
	export PIPETRAIN_SLOW
	# shellcheck disable=SC2086 # common and EXTRA are lists of options
	others_run "$BIN" $common $EXTRA "$@" --log "$OUT/$name.csv" \
		--save "$WORK/$name.safetensors" --json >"$WORK/$name.json" 2>"$OUT/$name.err"
	others_sum=$(awk -v a="$others_sum" -v b="$OTHERS" 'BEGIN { print a + b }')
	sha256sum <"$WORK/$name.safetensors" | cut -c1-16 >"$WORK/$name.sha"
}
# the steps/s of an arm: the median step_ms over the last half of the steps after the change
sps() {
	awk -F, -v from="$((switch + (spe * EPOCHS - switch) / 2))" 'NR > 1 && $1 > from { print $8 }' "$OUT/$1.csv" |
		sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f", (m > 0 ? 1000 / m : 0) }'
}
arm static "$slow"
arm rebalance "$slow" --rebalance
cat "$OUT/rebalance.err"
moves=$(jq -r '.moves' "$WORK/rebalance.json")
cut=$(jq -r '.stages[1].first_layer' "$WORK/rebalance.json")
arm fresh "0:$((layers - 1)):$us" --split "$cut"
first=$(sed -n 's/^pipetrain: rebalance: move 1 after step \([0-9]*\):.*/\1/p' "$OUT/rebalance.err")
move_s=none
if [ -n "$first" ]; then
	move_s=$(awk -F, -v a="$switch" -v b="$first" 'NR > 1 && $1 == a { t0 = $10 } NR > 1 && $1 == b { t1 = $10 }
		END { printf "%.3f", t1 - t0 }' "$OUT/rebalance.csv")
fi
same=$(cat "$WORK"/static.sha "$WORK"/rebalance.sha "$WORK"/fresh.sha | sort -u | wc -l)
same=$([ "$same" = 1 ] && echo yes || echo no)
s_sps=$(sps static) r_sps=$(sps rebalance) f_sps=$(sps fresh)
echo "train_rebalance: model=$MODEL static=$s_sps rebalance=$r_sps fresh=$f_sps" \
	"x=$(awk -v a="$r_sps" -v b="$f_sps" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') moves=$moves move_s=$move_s" \
	"split=$cut same_weights=$same others=$(awk -v s="$others_sum" 'BEGIN { printf "%.2f", s / 3 }')"
[ "$same" = yes ] && [ "$moves" -ge 1 ]
