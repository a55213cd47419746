#!/usr/bin/env bash
# The pipeline across MPI ranks, under mpirun on this machine (shared memory, oversubscribed):
#   tests/mpi.sh BUILD_DIR     (what `make check-mpi` runs)
# test_mpi (order, conservation, stage errors, drain, cancel, back-pressure, set-up errors) and
# test_mpi_train (training across ranks: parameters bit for bit, failures, cancel) with 2 and 4 ranks; then mpi_fault: a stopped rank must end the run with the engine's error within the peer timeout
# (2 s) plus slack, a killed one with mpirun's. Each run is bounded by `timeout`: a hang fails the test.
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
exit $fail
