# shellcheck shell=sh
# Sourced by perf's scripts (sh): run one command and measure the CPU other processes took meanwhile.
#
#   others_run CMD [ARGS...]      (redirect the call to put CMD's output where it belongs)
#
# runs CMD and sets OTHERS to the CPUs other processes kept busy during it, on average: the busy jiffies
# of /proc/stat (user, nice, system, irq, softirq; not steal, which pipebench reports apart) less CMD's
# own user and system time (time(1): CMD and the children it waited for), over the wall time; 0 on a
# quiet machine, up to the CPU count. Returns CMD's exit status.

others_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }

others_run() {
	_o_time=$(mktemp)
	_o_b0=$(others_busy) _o_t0=$(date +%s.%N) _o_rc=0
	/usr/bin/time -f '%U %S' -o "$_o_time" "$@" || _o_rc=$?
	_o_b1=$(others_busy) _o_t1=$(date +%s.%N)
	# shellcheck disable=SC2034 # read by the scripts that source this file
	OTHERS=$(awk -v b0="$_o_b0" -v b1="$_o_b1" -v t0="$_o_t0" -v t1="$_o_t1" -v hz="$(getconf CLK_TCK)" \
		-v own="$(tail -1 "$_o_time")" \
		'BEGIN { split(own, o, " "); x = ((b1 - b0) / hz - o[1] - o[2]) / (t1 - t0); printf "%.2f", x < 0 ? 0 : x }')
	rm -f "$_o_time"
	return "$_o_rc"
}
