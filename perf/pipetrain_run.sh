#!/bin/sh
# The recorded pipetrain run and its comparisons (perf/results/pipetrain.md). Not a test.
#
#   1. accuracy: the issue's model (784,1024,1024,1024,10), 10 epochs of Fashion-MNIST, 1F1B on 2 stages,
#      AdamW 1e-3, batch 256 = 8 x 32: curves to perf/results/pipetrain-curves.csv, a picture (drawn by
#      pipetrain --plot) to perf/results/pipetrain-curves.svg;
#   2. the same result for every schedule and stage count: GPipe on 1 stage, 1F1B on 2, ZB-H1 on 4, two
#      epochs on a 16384-row subset each, checkpoints compared byte for byte (perf/results/pipetrain-same.csv);
#   3. throughput: one stage on one thread (one BLAS thread), one stage with OpenBLAS on 2 threads, 2
#      stages under 1F1B and ZB-H1 (and ZB-H1 with whole layers per stage, --hand-over off); one short
#      epoch (--limit) per run, the arms alternated ROUNDS times,
#      medians (perf/results/pipetrain-throughput.csv); for MODELS (the issue's and a deeper one);
#   4. activation memory: GPipe against 1F1B on 4 stages, 8 micro-batches: the stash high-water marks;
#   5. throughput with each arm at its best micro-batch: one stage on the whole batch against 2 stages on
#      micro-batches of 64 and 128 (perf/results/pipetrain-throughput-batch.csv);
#   6. the hand-over of a layer's input gradient against whole layers per stage, paired rounds
#      (perf/results/pipetrain-hand-over.csv);
#   7. activation recomputation: --recompute none, all and single layers (RC_LAYERS) on the issue's model,
#      2 stages, under RC_SCHEDULES, the arms alternated ROUNDS times: steps/s, the peak activation
#      memory held at once and the activation pool's high-water mark, and the CPU other processes took
#      during each run (perf/results/pipetrain-recompute.csv and -median.csv).
#
# Usage (from the build directory): sh ../perf/pipetrain_run.sh [OUT_DIR]     (default ../perf/results)
# Environment: PIPETRAIN (binary; tools/pipetrain/pipetrain), ROUNDS (3), LIMIT (8192), EPOCHS (10),
#   MODELS ("784,1024,1024,1024,10 784,1024,1024,1024,1024,1024,10"), PARTS (which parts: "1 2 3 4 5 6"),
#   EXTRA (more options for every throughput arm, e.g. "--batch 512"), RC_LAYERS ("1 2"), RC_SCHEDULES
#   ("1f1b zbh1").
set -eu
BIN=${PIPETRAIN:-tools/pipetrain/pipetrain}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=perf/others.sh
. "$here/others.sh"
OUT=${1:-$here/results}
ROUNDS=${ROUNDS:-3}
LIMIT=${LIMIT:-8192}
EPOCHS=${EPOCHS:-10}
MODELS=${MODELS:-784,1024,1024,1024,10 784,1024,1024,1024,1024,1024,10}
PARTS=${PARTS:-1 2 3 4 5 6}
EXTRA=${EXTRA:-}
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac }
command -v jq >/dev/null || { echo "pipetrain_run: jq not found (apt-get install jq)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "pipetrain_run: $BIN not built (make tools/pipetrain/pipetrain)" >&2; exit 2; }
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "pipetrain_run: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at start"

# 1. The recorded run.
if part 1; then
	set -- --layers 784,1024,1024,1024,10 --stages 2 --schedule 1f1b --batch 256 --mb 32 --epochs "$EPOCHS" \
		--optimizer adamw --lr 1e-3 --seed 1
	echo "pipetrain_run: $BIN $* --csv $OUT/pipetrain-curves.csv --plot $OUT/pipetrain-curves.svg"
	"$BIN" "$@" --csv "$OUT/pipetrain-curves.csv" --plot "$OUT/pipetrain-curves.svg" \
		--save "$WORK/m.safetensors" --no-progress | tee "$OUT/pipetrain-run.txt"
	echo "pipetrain_run: load $(cut -d' ' -f1-3 /proc/loadavg) after the recorded run"
fi

# 2. Same weights for every schedule and stage count.
if part 2; then
echo "schedule,stages,test_acc,val_acc,train_loss,sha256" >"$OUT/pipetrain-same.csv"
for arm in gpipe:1 1f1b:2 zbh1:4; do
	s=${arm%%:*} n=${arm##*:}
	"$BIN" --layers 784,1024,1024,1024,10 --limit 16384 --epochs 2 --schedule "$s" --stages "$n" \
		--save "$WORK/$s.safetensors" --json --quiet >"$WORK/$s.json"
	echo "$s,$n,$(jq -r '.epochs[-1] | "\(.test_accuracy),\(.val_accuracy),\(.train_loss)"' "$WORK/$s.json"),$(sha256sum <"$WORK/$s.safetensors" | cut -c1-16)" >>"$OUT/pipetrain-same.csv"
done
cat "$OUT/pipetrain-same.csv"
fi

# Throughput: "throughput NAME MODELS ARM..." runs each ARM ("name:options") for one short epoch on each
# model, the arms alternated ROUNDS times, into $OUT/NAME.csv, and the medians, with each arm's ratio to
# the first one, into $OUT/NAME-median.csv (the model's widths joined by '-').
throughput() {
	tag=$1 csv=$OUT/$1.csv models=$2
	shift 2
	echo "model,arm,round,samples_per_s,bubble,load1" >"$csv"
	for model in $models; do
		for r in $(seq 1 "$ROUNDS"); do
			for arm in "$@"; do
				name=${arm%%:*} args=${arm#*:}
				# shellcheck disable=SC2086 # args and EXTRA are lists of options
				"$BIN" --layers "$model" --limit "$LIMIT" --epochs 1 --val 1000 $args $EXTRA --json --quiet >"$WORK/t.json"
				echo "$(echo "$model" | tr , -),$name,$r,$(jq -r '.epochs[0] | "\(.samples_per_s),\(.bubble)"' "$WORK/t.json"),$(cut -d' ' -f1 /proc/loadavg)" >>"$csv"
			done
		done
	done
	# x_first: the ratio of the medians; x_first_paired: the median of the ratios round by round (each
	# round's runs follow each other, so a slow moment of the machine touches both sides of a ratio).
	echo "model,arm,median_samples_per_s,x_first,x_first_paired" >"$WORK/med.csv"
	# shellcheck disable=SC2016 # an awk program
	median='{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
	for model in $(echo "$models" | tr , -); do
		base='' first=''
		for arm in "$@"; do
			name=${arm%%:*}
			[ -n "$first" ] || first=$name
			med=$(awk -F, -v m="$model" -v a="$name" '$1 == m && $2 == a { print $4 }' "$csv" | sort -g | awk "$median")
			paired=$(awk -F, -v m="$model" -v a="$name" -v f="$first" '$1 == m && $2 == f { b[$3] = $4 }
				$1 == m && $2 == a { x[$3] = $4 } END { for (r in x) if (b[r] > 0) print x[r] / b[r] }' "$csv" |
				sort -g | awk "$median")
			[ -n "$base" ] || base=$med
			echo "$model,$name,$med,$(awk -v a="$med" -v b="$base" -v p="$paired" 'BEGIN { printf "%.2f,%.3f", a / b, p }')" >>"$WORK/med.csv"
		done
	done
	cat "$WORK/med.csv"
	cp "$WORK/med.csv" "$OUT/$tag-median.csv"
}

# 3. Throughput at the recorded run's micro-batch (32), every arm alike.
if part 3; then
	throughput pipetrain-throughput "$MODELS" "seq1:--stages 1 --threads 1" "blas2:--stages 1 --blas-threads 2" \
		"1f1b-s2:--stages 2 --schedule 1f1b" "zbh1-s2:--stages 2 --schedule zbh1" \
		"zbh1-s2-whole-layers:--stages 2 --schedule zbh1 --hand-over off"
fi

# 4. Activation memory: the stash high-water marks, GPipe against 1F1B, 4 stages, M = 8.
if part 4; then
echo "schedule,stage,stash_peak,held_peak,peak_activation_bytes" >"$OUT/pipetrain-memory.csv"
for s in gpipe 1f1b zbh1; do
	"$BIN" --layers 784,1024,1024,1024,10 --limit 2048 --epochs 1 --val 1000 --stages 4 --schedule "$s" \
		--json --quiet >"$WORK/mem.json"
	jq -r --arg s "$s" '.stages | to_entries[] | "\($s),\(.key),\(.value.stash_peak),\(.value.held_peak),\(.value.peak_activation_bytes)"' \
		"$WORK/mem.json" >>"$OUT/pipetrain-memory.csv"
done
cat "$OUT/pipetrain-memory.csv"
fi

# 5. Throughput, each arm at its best micro-batch: one stage computes the whole batch of 256 in one go
#    (larger matrices run faster in OpenBLAS), two stages split it in 4 or 2 (the issue's model only).
if part 5; then
	throughput pipetrain-throughput-batch "${MODELS%% *}" "seq1-whole:--stages 1 --threads 1 --mb 256" \
		"blas2-whole:--stages 1 --blas-threads 2 --mb 256" "zbh1-s2-mb64:--stages 2 --schedule zbh1 --mb 64" \
		"zbh1-s2-mb128:--stages 2 --schedule zbh1 --mb 128" "1f1b-s2-mb128:--stages 2 --schedule 1f1b --mb 128" \
		"zbh1-s2-mb64-whole-layers:--stages 2 --schedule zbh1 --mb 64 --hand-over off"
fi

# 6. What handing a layer's input gradient over to the next stage gives: ZB-H1 on 2 stages with the
#    default split (--hand-over auto) against whole layers per stage, 2 x ROUNDS rounds, paired.
if part 6; then
	rounds=$ROUNDS
	ROUNDS=$((2 * rounds))
	throughput pipetrain-hand-over "${MODELS%% *}" \
		"whole-layers:--stages 2 --schedule zbh1 --hand-over off" "hand-over:--stages 2 --schedule zbh1"
	ROUNDS=$rounds
fi

# 7. Activation recomputation: what it costs in steps/s and saves in activation memory.
if part 7; then
	RC_LAYERS=${RC_LAYERS:-1 2}
	RC_SCHEDULES=${RC_SCHEDULES:-1f1b zbh1}
	csv=$OUT/pipetrain-recompute.csv
	echo "schedule,recompute,round,steps_per_s,samples_per_s,peak_activation_bytes,activation_pool_bytes,recompute_s,others_cpus,load1" >"$csv"
	for r in $(seq 1 "$ROUNDS"); do
		for s in $RC_SCHEDULES; do
			for rc in none all $RC_LAYERS; do
				# shellcheck disable=SC2086 # EXTRA is a list of options
				others_run "$BIN" --layers 784,1024,1024,1024,10 --limit "$LIMIT" \
					--epochs 1 --val 1000 --stages 2 --schedule "$s" --batch 256 --mb 32 --recompute "$rc" \
					$EXTRA --json --quiet >"$WORK/rc.json"
				echo "$s,$(echo "$rc" | tr , +),$r,$(jq -r '"\(.epochs[0].samples_per_s / .config.batch),\(.epochs[0].samples_per_s),\(.peak_activation_bytes),\(.activation_pool_bytes),\([.stages[].recompute_s] | add)"' "$WORK/rc.json"),$OTHERS,$(cut -d' ' -f1 /proc/loadavg)" >>"$csv"
			done
		done
	done
	cat "$csv"
	# shellcheck disable=SC2016 # an awk program
	median='{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
	echo "schedule,recompute,median_steps_per_s,x_none_paired,peak_activation_MiB,activation_pool_MiB,median_others_cpus" >"$WORK/rcm.csv"
	for s in $RC_SCHEDULES; do
		for rc in none all $RC_LAYERS; do
			k=$(echo "$rc" | tr , +)
			med=$(awk -F, -v s="$s" -v k="$k" '$1 == s && $2 == k { print $4 }' "$csv" | sort -g | awk "$median")
			paired=$(awk -F, -v s="$s" -v k="$k" '$1 == s && $2 == "none" { b[$3] = $4 }
				$1 == s && $2 == k { x[$3] = $4 } END { for (r in x) if (b[r] > 0) print x[r] / b[r] }' "$csv" | sort -g | awk "$median")
			mem=$(awk -F, -v s="$s" -v k="$k" '$1 == s && $2 == k { printf "%.2f,%.2f\n", $6 / 1048576, $7 / 1048576; exit }' "$csv")
			oth=$(awk -F, -v s="$s" -v k="$k" '$1 == s && $2 == k { print $9 }' "$csv" | sort -g | awk "$median")
			echo "$s,$k,$med,$paired,$mem,$oth" >>"$WORK/rcm.csv"
		done
	done
	cat "$WORK/rcm.csv"
	cp "$WORK/rcm.csv" "$OUT/pipetrain-recompute-median.csv"
fi

echo "pipetrain_run: load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
