#!/bin/sh
# pipetrain against PyTorch on the same training run, and against the 2-core roofline (a benchmark, not a
# test; perf/results/train-vs-torch.md).
#
# The run: the issue's model (784-1024-1024-1024-10, ReLU), one epoch of Fashion-MNIST (55,000 rows, 5,000
# held out), batch 256, AdamW 1e-3 with pipetrain's defaults (warm-up, cosine decay to 0, clip 1, no weight
# decay), the default OpenBLAS kernel (OPENBLAS_CORETYPE left as the environment has it, the same for
# every arm). The arms, alternated round by round, ROUNDS rounds:
#   torch2, torch1  perf/pipetrain_torch.py on 2 threads and on 1 (torch.set_num_threads and OpenBLAS's)
#   each of ARMS    pipetrain with those options ("name:options"), and, with OLD set, the same options
#                   on the OLD binary ("old-name"), for a before/after in the same rounds
# Per run: samples/s of the epoch, test accuracy, and the CPU time other processes took while it ran
# (busy jiffies of /proc/stat minus the run's own user and system time, over its wall time: 0 on a
# quiet machine, up to the CPU count). Medians per arm; x_torch2: the median of each round's ratio to
# that round's torch2 run (a slow moment of the machine touches both sides of a ratio). The roofline:
# perf/bench_mlp_train --roofline at each arm's micro-batch (its limit_sps: every sgemm of a step at the
# rate both cores reach at once, nothing else; the higher of the weights packed and padded, measured
# before and after the rounds), and each arm's fraction of it.
#
# Usage (from the build directory): sh ../perf/train_vs_torch.sh [OUT_DIR]      (default ../perf/results)
# Environment: PIPETRAIN (tools/pipetrain/pipetrain), BENCH (perf/bench_mlp_train; built with
#   make perf/bench_mlp_train), PYTHON (/usr/bin/python3, which has Debian's python3-torch), ROUNDS (5),
#   EPOCHS (1), LIMIT (0: every training row), OLD (another pipetrain binary, e.g. main's), ARMS (default
#   "1f1b:--schedule 1f1b zbh1:--schedule zbh1 zbh1-mb64:--schedule zbh1 --mb 64
#   zbh1-mb128:--schedule zbh1 --mb 128"; the options of an arm are joined by spaces, arms by newlines
#   when ARMS is given).
# Prints one line per run, the medians, and one summary line:
#   train_vs_torch: rounds=R kernel=K cpus=C torch2_sps=X torch1_sps=X ARM_sps=X ARM_x_torch2=X
#   ARM_roofline=X ... others_cpus=X
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BIN=${PIPETRAIN:-tools/pipetrain/pipetrain}
BENCH=${BENCH:-perf/bench_mlp_train}
PY=${PYTHON:-/usr/bin/python3}
OUT=${1:-$here/results}
ROUNDS=${ROUNDS:-5}
EPOCHS=${EPOCHS:-1}
LIMIT=${LIMIT:-0}
OLD=${OLD:-}
MODEL=784,1024,1024,1024,10
DEFAULT_ARMS='1f1b:--schedule 1f1b
zbh1:--schedule zbh1
zbh1-mb64:--schedule zbh1 --mb 64
zbh1-mb128:--schedule zbh1 --mb 128'
ARMS=${ARMS:-$DEFAULT_ARMS}

command -v jq >/dev/null || { echo "train_vs_torch: jq not found (apt-get install jq)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "train_vs_torch: $BIN not built (make tools/pipetrain/pipetrain)" >&2; exit 2; }
[ -z "$OLD" ] || [ -x "$OLD" ] || { echo "train_vs_torch: OLD=$OLD is not a program" >&2; exit 2; }
if ! "$PY" -c 'import torch' 2>/dev/null; then
	echo "train_vs_torch: PyTorch not found for $PY: apt-get install -y python3-torch (Debian's 1.13," \
		"which runs on the system's OpenBLAS); or PYTHON=/path/to/a/python with torch" >&2
	exit 2
fi
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CPUS=$(nproc)
KERNEL=$("$PY" -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())' 2>/dev/null || echo unknown)
echo "train_vs_torch: $CPUS CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), OpenBLAS kernel $KERNEL, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, load $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "train_vs_torch: torch: $("$PY" -c 'import torch; print(torch.__version__, "BLAS", [l for l in torch.__config__.show().splitlines() if "BLAS_INFO" in l][0].split("BLAS_INFO=")[1].split(",")[0])')"

# shellcheck source=perf/others.sh
. "$here/others.sh"

# measure NAME CMD...: runs CMD (its output into $WORK/NAME.out), sets OTHERS (the CPUs other processes
# used meanwhile, on average: perf/others.sh).
measure() {
	mout=$WORK/$1.out
	shift
	others_run "$@" >"$mout"
}

# roofline MB: bench_mlp_train --roofline at MB rows, the weights packed (a caller's matrices) and padded
# (the library's stages' layout), into $WORK/roof-MB: the highest limit of these and of earlier calls (a
# limit: the best the machine showed).
roofline() {
	for layout in '' --padded; do
		# shellcheck disable=SC2086 # layout is an option or nothing
		"$BENCH" --roofline $layout --mb "$1" --reps 10 | grep '^bench_mlp_train_roofline:' >"$WORK/roof-new" ||
			continue
		if [ -f "$WORK/roof-$1" ] && [ "$(sed -n 's/.* limit_sps=\([0-9]*\).*/\1/p' "$WORK/roof-$1")" -ge \
			"$(sed -n 's/.* limit_sps=\([0-9]*\).*/\1/p' "$WORK/roof-new")" ]; then
			continue
		fi
		mv "$WORK/roof-new" "$WORK/roof-$1"
	done
}

lim=''
[ "$LIMIT" = 0 ] || lim="--limit $LIMIT"
# The rooflines before the rounds (again after them: the higher of the two is kept).
if [ -x "$BENCH" ]; then
	for mb in 256 $(echo "$ARMS" | sed -n 's/.*--mb \([0-9]*\).*/\1/p') 32; do roofline "$mb"; done
fi
csv=$OUT/train-vs-torch.csv
echo "round,arm,samples_per_s,test_acc,bubble,mb,others_cpus,load1" >"$csv"
arms_list() {
	echo "$ARMS" | while IFS= read -r a; do [ -n "$a" ] && echo "$a"; done
	[ -z "$OLD" ] || echo "$ARMS" | while IFS= read -r a; do [ -n "$a" ] && echo "old-$a"; done
}
for r in $(seq 1 "$ROUNDS"); do
	for t in 2 1; do
		# shellcheck disable=SC2086 # lim is a list of options
		measure torch "$PY" "$here/pipetrain_torch.py" --threads "$t" --epochs "$EPOCHS" $lim
		line=$(grep '^pipetrain_torch:' "$WORK/torch.out")
		sps=$(echo "$line" | sed 's/.*samples_per_s=\([0-9.]*\).*/\1/')
		acc=$(echo "$line" | sed 's/.*test_acc=\([0-9.]*\).*/\1/')
		echo "$r,torch$t,$sps,$acc,,256,$OTHERS,$(cut -d' ' -f1 /proc/loadavg)" >>"$csv"
		echo "round $r torch$t: $sps samples/s, test acc $acc, others $OTHERS CPUs"
	done
	arms_list >"$WORK/arms"
	while IFS= read -r arm; do
		name=${arm%%:*} args=${arm#*:} bin=$BIN
		case $name in old-*) bin=$OLD ;; esac
		# shellcheck disable=SC2086 # args and lim are lists of options
		measure pt "$bin" --layers "$MODEL" --epochs "$EPOCHS" $lim $args --json --quiet </dev/null
		vals=$(jq -r '"\(.epochs[-1].samples_per_s | round),\(.test_accuracy),\(.epochs[-1].bubble * 1000 | round / 1000),\(.config.mb)"' "$WORK/pt.out")
		echo "$r,$name,$vals,$OTHERS,$(cut -d' ' -f1 /proc/loadavg)" >>"$csv"
		echo "round $r $name: $(echo "$vals" | cut -d, -f1) samples/s, test acc $(echo "$vals" | cut -d, -f2), bubble $(echo "$vals" | cut -d, -f3), mb $(echo "$vals" | cut -d, -f4), others $OTHERS CPUs"
	done <"$WORK/arms"
done

# Medians, paired ratios to torch2, roofline fractions.
# shellcheck disable=SC2016 # an awk program
median='{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
col() { awk -F, -v a="$1" -v c="$2" 'NR > 1 && $2 == a { print $c }' "$csv" | sort -g | awk "$median"; }
paired() {
	awk -F, -v a="$1" 'NR > 1 && $2 == "torch2" { t[$1] = $3 } NR > 1 && $2 == a { x[$1] = $3 }
		END { for (r in x) if (t[r] > 0) print x[r] / t[r] }' "$csv" | sort -g | awk "$median"
}
med=$OUT/train-vs-torch-median.csv
echo "arm,median_samples_per_s,x_torch2_paired,test_acc,mb,roofline_limit_sps,fraction_of_limit" >"$med"
summary="train_vs_torch: rounds=$ROUNDS kernel=$KERNEL cpus=$CPUS"
for arm in torch2 torch1 $(arms_list | cut -d: -f1); do
	sps=$(col "$arm" 3) acc=$(col "$arm" 4) mb=$(col "$arm" 6) x=$(paired "$arm")
	limit=''
	if [ -x "$BENCH" ] && [ -n "$mb" ]; then
		roofline "$mb"
		limit=$(sed -n 's/.* limit_sps=\([0-9.]*\).*/\1/p' "$WORK/roof-$mb")
	fi
	frac=$(awk -v s="$sps" -v l="$limit" 'BEGIN { if (l > 0) printf "%.3f", s / l }')
	echo "$arm,$sps,$x,$acc,$mb,$limit,$frac" >>"$med"
	summary="$summary ${arm}_sps=$sps"
	case $arm in torch2) ;; *) summary="$summary ${arm}_x_torch2=$(printf %.3f "$x")" ;; esac
	[ -z "$frac" ] || summary="$summary ${arm}_roofline=$frac"
done
cat "$med"
for f in "$WORK"/roof-*; do [ ! -f "$f" ] || cat "$f"; done
others=$(awk -F, 'NR > 1 { print $7 }' "$csv" | sort -g | awk "$median")
echo "$summary others_cpus=$others"
echo "train_vs_torch: load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
