#!/bin/sh
# Where one bench_mlp peer's time goes, per thread and per micro-batch: perf record -e cpu-clock (the
# counter these VMs allow, one sample per 1/FREQ s of CPU, stamped on CLOCK_MONOTONIC), reported over the
# measurement only (the window bench_mlp -v prints: set-up, calibration and checks are left out), each
# thread's samples sorted into categories by symbol, scaled to microseconds per micro-batch with the
# rows/s the run reports (a sequential peer's micro-batch is its batch). A thread's time off CPU (parked,
# waiting for a micro-batch or for room, or preempted by another process: read it with the "others"
# column and the stages' busy/starved/blocked line) is what its samples do not cover: the idle column.
#
#   perf/mlp_profile.sh BENCH_MLP PEER BATCH [MICRO_BATCH]
#       e.g. perf/mlp_profile.sh build/perf/bench_mlp pipe-str 64 64
#            perf/mlp_profile.sh build/perf/bench_mlp seqmt 64
#   ROUNDS (5), SECONDS_EACH (1), FREQ (4000 Hz), TOP (8: each thread's symbols listed) from the
#   environment; KEEP=1 keeps the recording and bench_mlp's output (the directory is printed).
#
# Categories: product (OpenBLAS's sgemm/sgemv kernels), packing (OpenBLAS copying its operands into its
# own layout), bias+act (the layer code around the product: the ReLU, the loops of lib/model/layers.c and
# of bench_mlp's OpenBLAS peer), copies (memcpy/memmove: the bias rows copied into the output, the
# hand-offs' copies), engine (mbpipe's rings, pool, workers, jobs), OpenBLAS sync (its driver and worker
# threads' waits), wait (yield, futex, the scheduler: on CPU but not computing), other; idle is off CPU.
set -eu
bench=${1:?usage: mlp_profile.sh BENCH_MLP PEER BATCH [MICRO_BATCH]}
peer=${2:?peer}
batch=${3:?batch}
mb=${4:-$batch}
rounds=${ROUNDS:-5}
secs=${SECONDS_EACH:-1}
freq=${FREQ:-4000}
top=${TOP:-8}
tmp=$(mktemp -d /tmp/mlp_profile.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
uptime
[ -z "${KEEP:-}" ] || echo "mlp_profile.sh: recording in $tmp"
perf record -q -e cpu-clock -c $((1000000000 / freq)) -k CLOCK_MONOTONIC -o "$tmp/perf.data" -- \
	"$bench" -k "$peer" -b "$batch" -m "$mb" -r "$rounds" -t "$secs" -v >"$tmp/out" 2>&1
grep -E "^bench_mlp: cpus|pipe-str:|pipe:|^ +$batch " "$tmp/out" || true
key=$(case $peer in pipe-str) echo stream ;; *) echo "$peer" ;; esac)
rps=$(sed -n "s/.* b${batch}_${key}=\([0-9.]*\).*/\1/p" "$tmp/out")
win=$(sed -n 's/^ *measured: \([0-9.]*\)-\([0-9.]*\) s .*/\1,\2/p' "$tmp/out")
[ -n "$rps" ] && [ -n "$win" ] || { echo "mlp_profile.sh: no rate or window in bench_mlp's output" >&2; cat "$tmp/out" >&2; exit 1; }
dur=$(echo "$win" | awk -F, '{ printf "%.3f", ($2 - $1) * 1000 }')
perf report -i "$tmp/perf.data" --time "$win" -n --sort pid,sym --stdio 2>/dev/null | grep -v '^#' | grep . >"$tmp/rep"
awk -v rps="$rps" -v dur="$dur" -v freq="$freq" -v batch="$batch" -v mb="$mb" -v peer="$peer" -v top="$top" '
function cat(kind, s) {
	if (s ~ /sgemm_kernel|sgemv_[nt]|dgemm_kernel/) return "product"
	if (s ~ /sgemm_.*copy/) return "packing"
	if (kind == "[k]" || s ~ /sched_yield|futex|syscall|nanosleep/) return "wait"
	if (s ~ /memmove|memcpy|memset/) return "copies"
	if (s ~ /mbp__layer_(fwd|run)|mbp__layers_run|mbp__relu|activate|layer_norm|blas_forward|run_seq/) return "bias+act"
	if (s ~ /sgemm_|sgemv_|blas_|exec_|inner_|gemm_|openblas|goto|level3/) return "OpenBLAS sync"
	if (s ~ /^mbp|ring|pool|worker|ingress|job|crew|wait_|stage_/) return "engine"
	return "other"
}
{
	n = $2; split($3, a, ":"); tid = a[1]; comm = a[2]; kind = $4; sym = $5
	if (!(tid in name)) { name[tid] = comm; order[++nt] = tid }
	c = cat(kind, sym); t[tid, c] += n; tot[tid] += n
	if (++seen[tid] <= top) list[tid] = list[tid] sprintf("  %s %s (%s)", $1, sym, c)
}
END {
	split("product,packing,bias+act,copies,engine,OpenBLAS sync,wait,other", cats, ",")
	nmb = int((batch + mb - 1) / mb)
	per = batch / rps * 1e6 / nmb # us per micro-batch
	printf "%s, batch %d, micro-batch %d (%d a batch): %.1f rows/s, %.0f us per batch, %.0f us per micro-batch; sample window %.0f ms\n", peer, batch, mb, nmb, rps, per * nmb, per, dur
	printf "%-16s %8s", "thread", "on-CPU"
	for (k = 1; k <= 8; k++) printf " %13s", cats[k]
	printf " %13s   (us per micro-batch, %% of the thread'\''s time)\n", "idle"
	for (i = 1; i <= nt; i++) {
		tid = order[i]; cpu = tot[tid] / freq / (dur / 1000)
		if (cpu < 0.02) continue
		printf "%-16s %7.0f%%", name[tid] "/" tid, 100 * cpu
		for (k = 1; k <= 8; k++) {
			f = t[tid, cats[k]] / freq / (dur / 1000)
			printf " %6.0f (%3.0f%%)", f * per, 100 * f
		}
		f = cpu < 1 ? 1 - cpu : 0
		printf " %6.0f (%3.0f%%)\n", f * per, 100 * f
	}
	printf "top symbols (%% of all samples in the window):\n"
	for (i = 1; i <= nt; i++)
		if (tot[order[i]] / freq / (dur / 1000) >= 0.02)
			printf "%s/%s:%s\n", name[order[i]], order[i], list[order[i]]
}' "$tmp/rep"
