#!/bin/sh
# Load test of pipeserve with wrk on loopback: the model split into a pipeline across the allowed CPUs
# against the same model as a single stage, in the same run, alternating (A B A B ...) and reporting
# medians. Not a test: it prints a table and one summary line, and exits 1 when any request failed
# (wrk's connect/read/write/timeout errors or a non-2xx status) or the server did not stop cleanly.
#
# Usage (from the build directory): perf/pipeserve_load.sh        (or: sh /path/to/perf/pipeserve_load.sh)
# Environment: PIPESERVE (server binary; default tools/pipeserve/pipeserve), DURATION (seconds per run, 5),
#   CONNS (wrk connections, 32), WRK_THREADS (2), ROUNDS (pairs of runs, 3), ROWS (rows per request, 4),
#   DEMO (demo model spec; default layers=6,in=128,hidden=512,out=16), SERVER_ARGS (extra server flags).
set -u

BIN=${PIPESERVE:-tools/pipeserve/pipeserve}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
WRK_THREADS=${WRK_THREADS:-2}
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-4}
DEMO=${DEMO:-layers=6,in=128,hidden=512,out=16}
SERVER_ARGS=${SERVER_ARGS:-}

command -v wrk >/dev/null || { echo "pipeserve_load: wrk not found (apt-get install wrk)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "pipeserve_load: $BIN not built (make tools/pipeserve/pipeserve)" >&2; exit 2; }

WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
	[ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

IN_W=$(echo "$DEMO" | tr ',' '\n' | sed -n 's/^in=//p')
IN_W=${IN_W:-128}

# The request body: ROWS x IN_W floats as JSON, the same for every request.
awk -v rows="$ROWS" -v w="$IN_W" 'BEGIN {
	printf "{\"id\":\"load\",\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[%d,%d],\"data\":[", rows, w
	for (i = 0; i < rows * w; i++) printf "%s%.6f", (i ? "," : ""), sin(i * 0.1)
	printf "]}]}"
}' >"$WORK/body.json"

cat >"$WORK/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open("$WORK/body.json", "rb"))
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
	local e = summary.errors
	io.write(string.format("RESULT requests=%d duration_us=%d p50_us=%.0f p99_us=%.0f errors=%d\n",
		summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
		e.connect + e.read + e.write + e.status + e.timeout))
end
EOF

# run LABEL STAGES: one server, one wrk run; appends "label rps p50_ms p99_ms errors mean_batch" to results.
run() {
	label=$1
	stages=$2
	RUN=$((RUN + 1))
	addr="$WORK/addr.$RUN" # a fresh file: never the previous server's address
	# shellcheck disable=SC2086 # SERVER_ARGS is a list of flags
	"$BIN" --port 0 --demo "$DEMO" --stages "$stages" $SERVER_ARGS >"$addr" 2>"$WORK/log.$label" &
	SERVER_PID=$!
	url=
	for _ in $(seq 1 200); do
		url=$(head -n 1 "$addr" 2>/dev/null)
		[ -n "$url" ] && break
		sleep 0.05
	done
	if [ -z "$url" ]; then
		echo "pipeserve_load: the server did not start:" >&2
		cat "$WORK/log.$label" >&2
		exit 1
	fi
	wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/post.lua" "$url/v2/models/demo/infer" \
		>"$WORK/wrk.$label" 2>&1
	metrics=$(curl -s "$url/metrics")
	kill -TERM "$SERVER_PID"
	wait "$SERVER_PID"
	st=$?
	SERVER_PID=
	line=$(grep '^RESULT' "$WORK/wrk.$label")
	if [ -z "$line" ] || [ "$st" -ne 0 ]; then
		echo "pipeserve_load: $label run failed (server exit $st):" >&2
		cat "$WORK/wrk.$label" "$WORK/log.$label" >&2
		exit 1
	fi
	bsum=$(echo "$metrics" | sed -n 's/^pipeserve_batch_rows_sum{[^}]*} //p')
	bcnt=$(echo "$metrics" | sed -n 's/^pipeserve_batch_rows_count{[^}]*} //p')
	placement=$(grep -o 'placement: .*' "$WORK/log.$label" | sed 's/placement: //' | paste -sd ';' -)
	echo "$line" | awk -v l="$label" -v bs="${bsum:-0}" -v bc="${bcnt:-0}" '{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "%s %.1f %.3f %.3f %d %.2f\n", l, v["requests"] / (v["duration_us"] / 1e6),
			v["p50_us"] / 1000, v["p99_us"] / 1000, v["errors"], (bc > 0 ? bs / bc : 0)
	}' >>"$WORK/results"
	echo "$label: $(tail -n 1 "$WORK/results" | cut -d' ' -f2-)  [$placement]" >&2
}

NCPU=$(nproc)
RUN=0
STAGES_ALL=0 # 0: one stage per allowed CPU (the server's default)
echo "pipeserve_load: $NCPU CPUs, $CONNS connections, $ROWS rows x $IN_W floats per request, ${DURATION}s x $ROUNDS rounds, demo $DEMO" >&2
echo "load before: $(uptime)" >&2
for r in $(seq 1 "$ROUNDS"); do
	run pipeline "$STAGES_ALL"
	run single 1
done
echo "load after: $(uptime)" >&2

# Medians per configuration (field: 2 rps, 3 p50, 4 p99; errors summed; 6 mean batch rows).
median() { grep "^$1 " "$WORK/results" | cut -d' ' -f"$2" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
errors() { grep "^$1 " "$WORK/results" | awk '{ s += $5 } END { print s + 0 }'; }

printf '%-10s %12s %10s %10s %8s %12s\n' config "req/s" "p50 ms" "p99 ms" errors "rows/batch"
for c in pipeline single; do
	printf '%-10s %12s %10s %10s %8s %12s\n' "$c" "$(median $c 2)" "$(median $c 3)" "$(median $c 4)" "$(errors $c)" \
		"$(median $c 6)"
done
perr=$(errors pipeline)
serr=$(errors single)
echo "pipeserve_load: cpus=$NCPU conns=$CONNS rows=$ROWS rounds=$ROUNDS pipeline_rps=$(median pipeline 2)" \
	"pipeline_p50_ms=$(median pipeline 3) pipeline_p99_ms=$(median pipeline 4) single_rps=$(median single 2)" \
	"single_p50_ms=$(median single 3) single_p99_ms=$(median single 4) errors=$((perr + serr))"
[ $((perr + serr)) -eq 0 ]
