#!/usr/bin/env bash
# The pipeline across MPI ranks, under mpirun on this machine (shared memory, oversubscribed):
#   tests/mpi.sh BUILD_DIR     (what `make check-mpi` runs)
# test_mpi (order, conservation, stage errors, drain, cancel, back-pressure, set-up errors) and
# test_mpi_train (training across ranks: parameters bit for bit, failures, cancel) with 2 and 4 ranks;
# then mpi_fault: a stopped rank must end the run with the engine's error within the peer timeout (2 s) plus
# slack, a killed one with mpirun's; then the tools under mpirun: pipebench's table and JSON,
# pipeserve's answers bit for bit as one process's and its clean stop on every rank, and their bad
# arguments (exit 2). Each run is bounded by `timeout`: a hang fails the test.
set -uo pipefail
b=${1:?usage: tests/mpi.sh BUILD_DIR}
MPIRUN=${MPIRUN:-mpirun}
# mpirun refuses root without these (CI runs as root); --oversubscribe: more ranks than the 2 CPUs.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Shared memory and loopback only: no network is needed (or wanted) by a test.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
run() { timeout "$1" "$MPIRUN" --oversubscribe -np "$2" "${@:3}"; }
fail=0
for t in test_mpi test_mpi_train; do
	for np in 2 4; do
		if run 300 "$np" "$b/tests/$t"; then
			echo "PASS: $t -np $np"
		else
			echo "FAIL: $t -np $np"
			fail=1
		fi
	done
done

# A stopped rank: rank 0's drain returns -ETIMEDOUT naming it, nothing is lost, then MPI_Abort ends all.
# A killed rank: mpirun ends the job and names the rank and the signal.
fault() { # MODE NP WHAT PATTERN...
	local mode=$1 np=$2 what=$3 out rc ms start ok=1
	shift 3
	out=$(mktemp)
	start=$(date +%s%N)
	run 60 "$np" "$b/tests/mpi_fault" "$mode" 2000 >"$out" 2>&1
	rc=$?
	ms=$((($(date +%s%N) - start) / 1000000))
	for pat in "$@"; do grep -q "$pat" "$out" || ok=0; done
	if [ $ok -eq 1 ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $ms -lt 15000 ]; then
		echo "PASS: $what (-np $np, $ms ms, exit $rc)"
	else
		echo "FAIL: $what (-np $np, $ms ms, exit $rc):"
		cat "$out"
		fail=1
	fi
	rm -f "$out"
}
for np in 2 4; do
	fault stop "$np" "a stopped rank ends the run with the engine's error" \
		"^mpi_fault: ok drain=ETIMEDOUT" "rank $((np - 1)) stopped answering"
	fault kill "$np" "a killed rank ends the run with mpirun's error" "rank $((np - 1)) .*exited on signal 9"
	fault train-stop "$np" "a stopped rank ends training with the engine's error" \
		"^mpi_fault: ok step=ETIMEDOUT at step 3" "rank $((np - 1)) stopped answering"
done

# ---- the tools under mpirun: pipebench (rank 0 measures) and pipeserve (HTTP on rank 0) ----
pb=$b/tools/pipebench/pipebench
ps=$b/tools/pipeserve/pipeserve
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
verdict() { # OK WHAT [FILE...]: PASS, or FAIL with the files shown
	local ok=$1 what=$2
	shift 2
	if [ "$ok" -eq 1 ]; then
		echo "PASS: $what"
	else
		echo "FAIL: $what"
		for f in "$@"; do echo "--- $f"; cat "$f"; done
		fail=1
	fi
}
# Bad arguments: exit 2 and one line from rank 0 alone, naming the rule.
bad() { # WHAT PATTERN NP CMD...
	local what=$1 pat=$2 np=$3 rc ok=0
	shift 3
	run 60 "$np" --bind-to none "$@" >"$tmp/bad.out" 2>&1
	rc=$?
	[ $rc -eq 2 ] && [ "$(grep -c "$pat" "$tmp/bad.out")" -eq 1 ] && ok=1
	verdict $ok "$what (exit $rc)" "$tmp/bad.out"
}

ok=0
run 120 2 --bind-to none "$pb" --workload synthetic --batch 32 --mb 4,8 --batches 3 --duration 1 \
	--wait-quiet 0 >"$tmp/pb.txt" 2>"$tmp/pb.err" &&
	grep -q "over 2 MPI ranks" "$tmp/pb.txt" && grep -q "rank 0: stage 0; rank 1: stage 1" "$tmp/pb.txt" &&
	grep -Eq '^ +4 +8 .* 0>1 ' "$tmp/pb.txt" && grep -Eq '^ +8 +4 .* 0>1 ' "$tmp/pb.txt" && ok=1
verdict $ok "pipebench -np 2 prints a table with the link's share of the hop" "$tmp/pb.txt" "$tmp/pb.err"
ok=0
run 120 2 --bind-to none "$pb" --workload mlp --layers 4 --hidden 64 --batch 32 --mb 8,32 --batches 3 \
	--duration 1 --wait-quiet 0 --json >"$tmp/pb.json" 2>"$tmp/pb.err" &&
	jq -e '.mode == "mpi" and .ranks == 2 and .stages == 2 and (.results | length) == 2 and
		all(.results[]; .rows_per_s > 0 and .rows_per_s_interval[0] <= .rows_per_s and .latency_ms.p99 > 0 and .batches >= 3 and (.hops | length) == 1 and
		    .hops[0].link_share >= 0 and .hops[0].link_share < 1 and .hops[0].compute_us > 0)' \
		"$tmp/pb.json" >/dev/null && ok=1
verdict $ok "pipebench -np 2 --json (mlp, each rank its layers) parses and has its fields" "$tmp/pb.json" \
	"$tmp/pb.err"
bad "pipebench: more ranks than stages" "^pipebench: 2 stages over 3 ranks: every rank needs a stage" 3 \
	"$pb" --workload synthetic --stages 2
bad "pipebench: --csv under mpirun" "^pipebench: --csv is not available under mpirun" 2 "$pb" --csv
bad "pipebench: the training workload under mpirun" "^pipebench: --workload=train does not run under mpirun" 2 \
	"$pb" --workload train
bad "pipebench: a bad option under mpirun" "^pipebench: unknown option .--no-such-option." 2 "$pb" --no-such-option
bad "pipebench: --svg under mpirun" "^pipebench: --svg is not available under mpirun" 2 "$pb" --svg="$tmp/x.svg"
bad "pipebench: --trace under mpirun" "^pipebench: --trace is not available under mpirun" 2 "$pb" --trace="$tmp/x.json"
bad "pipebench: more stages than layers" "^pipebench: 5 stages but the model has 4 layers" 2 \
	"$pb" --workload mlp --layers 4 --hidden 16 --stages 5

# pipeserve: the same requests answered bit for bit as by one process, then a clean stop of every rank.
serve() { # TAG LAUNCHER...: start in the background; sets spid (the launcher) and url (empty: none came)
	local tag=$1
	shift
	"$@" --port 0 --model "$tmp/m.safetensors" >"$tmp/$tag.out" 2>"$tmp/$tag.err" &
	spid=$!
	url=
	for _ in $(seq 300); do
		url=$(head -n1 "$tmp/$tag.out" 2>/dev/null)
		[ -n "$url" ] || ! kill -0 $spid 2>/dev/null && break
		sleep 0.1
	done
}
ask() { # TAG: both requests' answers into TAG.answers
	for r in 1 5; do
		curl -s --max-time 20 -X POST "$url/v2/models/m/infer" -H 'Content-Type: application/json' \
			-d @"$tmp/req$r.json"
		echo
	done >"$tmp/$1.answers"
}
"$ps" --write-demo-model "$tmp/m.safetensors" --demo layers=5,in=24,hidden=48,out=8,seed=7 >/dev/null
for r in 1 5; do
	data=$(awk -v n=$((r * 24)) -v r=$r 'BEGIN { for (i = 0; i < n; i++) printf "%s%.7f", (i ? "," : ""), sin(i * 0.37 + r) }')
	printf '{"inputs":[{"name":"input","shape":[%d,24],"datatype":"FP32","data":[%s]}]}' $r "$data" >"$tmp/req$r.json"
done
serve one timeout 60 "$ps" --stages 2
ask one
kill -TERM $spid
wait $spid
rc1=$?
serve two run 60 2 --bind-to none "$ps" --stages 2
ask two
pid0=$(sed -n 's/.*rank 0 (this one, pid \([0-9]*\)).*/\1/p' "$tmp/two.err")
ok=0
[ -n "$pid0" ] && kill -TERM "$pid0"
wait $spid
rc2=$?
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(grep -c '"outputs"' "$tmp/one.answers")" -eq 2 ] &&
	cmp -s "$tmp/one.answers" "$tmp/two.answers" && grep -q "rank 1: stopped: 2 micro-batches completed, 0 failed" "$tmp/two.err" &&
	grep -q "stopped: 2 infer requests answered, 0 failed" "$tmp/two.err" && ok=1
verdict $ok "pipeserve -np 2 answers bit for bit as one process; SIGTERM to rank 0 stops every rank (exit $rc1, $rc2)" \
	"$tmp/one.answers" "$tmp/two.answers" "$tmp/two.err"
# SIGTERM to mpirun: it passes the signal to every rank; rank 0 ends the run and every rank stops cleanly
# (mpirun itself then exits 1, as Open MPI's does when it was signalled).
serve three run 60 2 --bind-to none "$ps"
ask three
ok=0
mpid=$spid # below the shell running `run` and its timeout
for _ in 1 2 3; do
	[ "$(ps -o comm= -p "$mpid")" = mpirun ] && break
	mpid=$(pgrep -P "$mpid" | head -n1)
	[ -n "$mpid" ] || break
done
[ -n "$mpid" ] && kill -TERM "$mpid"
wait $spid
[ "$(grep -c '"outputs"' "$tmp/three.answers")" -eq 2 ] && [ "$(grep -c "stopped" "$tmp/three.err")" -eq 2 ] &&
	! grep -q "exited on signal" "$tmp/three.err" && ok=1
verdict $ok "pipeserve -np 2: SIGTERM to mpirun stops every rank cleanly" "$tmp/three.err"
bad "pipeserve: loads over HTTP under mpirun" "^pipeserve: --model-repository: loading models over HTTP is not supported" \
	2 "$ps" --model-repository "$tmp"
bad "pipeserve: more ranks than stages" "2 stages (the model has 6 layers) over 3 ranks: every rank needs a stage" \
	3 "$ps" --stages 2
bad "pipeserve: more stages than layers" "^pipeserve: --stages 9: the model has only 6 layers" 2 "$ps" --stages 9
bad "pipeserve: a bad option under mpirun" "^pipeserve: --port: '99999' is not a whole number" 2 "$ps" --port 99999
exit $fail
