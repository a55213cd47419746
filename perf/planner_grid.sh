#!/bin/sh
# Where the planner's choice ranks (issue 24). Not a test; run it on a quiet machine.
#
#   1. the grid: for each case (a model shape and a budget) the plan of `pipetrain --plan auto --memory
#      BUDGET --plan-only --json`, then every point of the grid the planner searches: threads 1 .. CPUS,
#      each schedule (gpipe, 1f1b, zbh1, zbh2 on T stages; interleaved, looped-bfs, zbv, dualpipev on 2T),
#      each profiled micro-batch size, recomputation none, all, and the plan's, split uniform (whole
#      layers spread evenly) and the plan's, each run by pipetrain with those options for STEPS steps;
#      per point the median step time of steps 2 .. STEPS (--log) and the measured peak memory (the
#      activation peak + the plan's state: parameters, gradients, optimizer moments). The plan itself runs
#      as a point too. Per case: the fastest point within the budget, the plan's rank among them and its
#      step over the best (the target: within 1.05), and whether the plan's measured peak is within the
#      budget (perf/results/planner-grid.csv, one row per point; planner-grid-summary.csv);
#   2. the issue's case: 784-2048x6-10, batch 1024, a budget of the state plus half the activations that
#      1F1B needs at the plan's micro-batch keeping every one (measured), the plan against the uniform
#      split with every stage recomputing (1F1B at the same micro-batch and threads), alternated ROUNDS
#      times, medians and the paired ratio (the target: at least 1.2; planner-issue.csv).
#
# Cases: CASES, space-separated "name:widths:batch"; each runs under two budgets, from the plan without a
# limit (its peak P) and the least memory any plan needs (N): N + (P - N) / 2 and N + (P - N) / 8.
# Usage (from the build directory): sh ../perf/planner_grid.sh [OUT_DIR]     (default ../perf/results)
# Environment: PIPETRAIN (tools/pipetrain/pipetrain), CASES (the three shapes below), STEPS (6), ROUNDS (3),
#   CPUS (nproc), PARTS ("1 2"), SIZES (the micro-batch sizes of the grid; default the plan's), ISSUE
#   (the issue's widths, "784,2048,2048,2048,2048,2048,2048,10"), ISSUE_BATCH (1024). QUICK=1: a tiny run
#   that proves the script works (small models, two sizes, two steps; figures meaningless).
set -eu
BIN=${PIPETRAIN:-tools/pipetrain/pipetrain}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=perf/others.sh
. "$here/others.sh"
OUT=${1:-$here/results}
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-3}
CPUS=${CPUS:-$(nproc)}
PARTS=${PARTS:-1 2}
CASES=${CASES:-uniform:784,512,512,512,512,512,10:256 wide:784,256,2048,256,256,10:256 deep:784,128,128,128,128,128,128,128,128,128,128,128,128,10:256}
ISSUE=${ISSUE:-784,2048,2048,2048,2048,2048,2048,10}
ISSUE_BATCH=${ISSUE_BATCH:-1024}
SIZES=${SIZES:-}
if [ "${QUICK:-0}" = 1 ]; then
	CASES="uniform:784,32,32,32,10:64 wide:784,16,96,16,10:64"
	ISSUE=784,64,64,64,10 ISSUE_BATCH=64 SIZES=${SIZES:-16 32} STEPS=2 ROUNDS=1
fi
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac }
command -v jq >/dev/null || { echo "planner_grid: jq not found (apt-get install jq)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "planner_grid: $BIN not built (make tools/pipetrain/pipetrain)" >&2; exit 2; }
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "planner_grid: $(nproc) CPUs (grid threads 1-$CPUS), load $(cut -d' ' -f1-3 /proc/loadavg) at start"
# shellcheck disable=SC2016 # an awk program
median='{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'

# plan WIDTHS BATCH [BUDGET]: the plan as JSON into $WORK/plan.json (0, or 2 when no plan fits).
plan() {
	mem=${3:+--memory $3}
	# shellcheck disable=SC2086 # mem is an option and its value, or nothing
	"$BIN" --layers "$1" --batch "$2" --plan auto $mem --plan-only --json --threads "$CPUS" 2>"$WORK/plan.err" >"$WORK/plan.json"
}

# uniform_split L S: the first layers of stages 1 .. S-1 when L layers are spread evenly.
uniform_split() { awk -v L="$1" -v S="$2" 'BEGIN { for (s = 1; s < S; s++) printf "%s%d", (s > 1 ? "," : ""), int(s * L / S) }'; }

# point WIDTHS BATCH ARGS...: one run of STEPS steps; sets MS (the median step of steps 2 .. STEPS, ms),
# ACT (the activation peak, bytes) and OTHERS (others.sh), or MS=n/a when pipetrain refused the point.
point() {
	widths=$1 batch=$2
	shift 2
	rm -f "$WORK/log.csv"
	MS=n/a ACT=n/a
	if others_run "$BIN" --layers "$widths" --batch "$batch" --limit $((batch * STEPS)) --val 0 --epochs 1 \
		--log "$WORK/log.csv" --json --quiet "$@" >"$WORK/p.json" 2>"$WORK/p.err"; then
		MS=$(awk -F, 'NR > 2 || (NR == 2 && steps == 1) { print $8 }' steps="$STEPS" "$WORK/log.csv" | sort -g | awk "$median")
		ACT=$(jq -r '.peak_activation_bytes' "$WORK/p.json")
	fi
}

# peak_fits STATE BUDGET: PEAK (ACT + STATE) and FITS (yes, no; n/a for a refused point).
peak_fits() {
	PEAK=n/a FITS=n/a
	[ "$MS" = n/a ] || { PEAK=$((ACT + $1)); FITS=$([ "$PEAK" -le "$2" ] && echo yes || echo no); }
}

# The plan's options for pipetrain, from $WORK/plan.json.
plan_args() {
	jq -r '.plan | "--stages \(.stages) --threads \(.threads) --schedule \(.schedule) --mb \(.mb) --hand-over off" +
		(if .stages > 1 then " --split " + ([.stage_layers[1:][] | .[0]] | map(tostring) | join(",")) else "" end) +
		" --recompute " + ([.stage_layers as $l | .recompute | to_entries[] | select(.value) | $l[.key] |
			"\(.[0])-\(.[1])"] | if length > 0 then join(",") else "none" end)' "$WORK/plan.json"
}

if part 1; then
	csv=$OUT/planner-grid.csv sum=$OUT/planner-grid-summary.csv
	echo "case,budget_bytes,point,schedule,stages,threads,mb,recompute,split,step_ms,peak_bytes,fits,others_cpus" >"$csv"
	echo "case,budget_bytes,plan,plan_step_ms,plan_peak_bytes,plan_fits,best_point,best_step_ms,plan_over_best,plan_rank,fitting_points" >"$sum"
	for c in $CASES; do
		name=${c%%:*} rest=${c#*:}
		widths=${rest%:*} batch=${rest##*:}
		L=$(($(echo "$widths" | tr , '\n' | wc -l) - 1))
		plan "$widths" "$batch" || { echo "planner_grid: $name: no plan: $(cat "$WORK/plan.err")" >&2; continue; }
		loose=$(jq -r '.plan.predicted_peak_bytes' "$WORK/plan.json") least=$(jq -r '.plan.smallest_budget_bytes' "$WORK/plan.json")
		sizes=${SIZES:-$(jq -r '.plan.sizes | map(tostring) | join(" ")' "$WORK/plan.json")}
		for frac in 2 8; do
			budget=$(awk -v n="$least" -v p="$loose" -v f="$frac" 'BEGIN { printf "%.0f", n + (p - n) / f }')
			plan "$widths" "$batch" "$budget" || { echo "planner_grid: $name: $(cat "$WORK/plan.err")" >&2; continue; }
			state=$(jq -r '.plan.state_bytes' "$WORK/plan.json")
			pargs=$(plan_args)
			psplit=$(jq -r '.plan | [.stage_layers[1:][] | .[0]] | map(tostring) | join(",")' "$WORK/plan.json")
			prc=$(jq -r '.plan | [.stage_layers as $l | .recompute | to_entries[] | select(.value) | $l[.key] | "\(.[0])-\(.[1])"] | if length > 0 then join(",") else "none" end' "$WORK/plan.json")
			pS=$(jq -r '.plan.stages' "$WORK/plan.json")
			echo "planner_grid: $name budget $budget: plan $pargs"
			# the points: "schedule stages threads mb recompute split" a line
			: >"$WORK/points"
			for T in $(seq 1 "$CPUS"); do
				for k in gpipe 1f1b zbh1 zbh2 interleaved looped-bfs zbv dualpipev; do
					case $k in gpipe | 1f1b | zbh1 | zbh2) S=$T ;; *) S=$((2 * T)) ;; esac
					[ "$S" -le "$L" ] || continue
					splits=$(uniform_split "$L" "$S")
					[ "$S" != "$pS" ] || [ "$psplit" = "$splits" ] || splits="$splits $psplit"
					rcs="none all"
					[ "$S" != "$pS" ] || [ "$prc" = none ] || [ "$prc" = all ] || rcs="$rcs $prc"
					for mb in $sizes; do
						for rc in $rcs; do
							for sp in ${splits:--}; do
								echo "$k $S $T $mb $rc $sp" >>"$WORK/points"
							done
						done
					done
				done
			done
			n=0
			{
				echo "plan"
				cat "$WORK/points"
			} | while read -r k S T mb rc sp; do
				if [ "$k" = plan ]; then
					# shellcheck disable=SC2086 # pargs is a list of options
					point "$widths" "$batch" $pargs
					set -- "$(jq -r .plan.schedule "$WORK/plan.json")" "$pS" "$(jq -r .plan.threads "$WORK/plan.json")" \
						"$(jq -r .plan.mb "$WORK/plan.json")" "$prc" "${psplit:--}"
					tag=plan
				else
					splitarg=""
					[ "$sp" = - ] || splitarg="--split $sp"
					# shellcheck disable=SC2086 # splitarg is an option and its value, or nothing
					point "$widths" "$batch" --stages "$S" --threads "$T" --schedule "$k" --mb "$mb" \
						--recompute "$rc" --hand-over off $splitarg
					set -- "$k" "$S" "$T" "$mb" "$rc" "$sp"
					n=$((n + 1))
					tag=grid$n
				fi
				peak_fits "$state" "$budget"
				echo "$name,$budget,$tag,$1,$2,$3,$4,$(echo "$5" | tr , +),$(echo "$6" | tr , +),$MS,$PEAK,$FITS,$OTHERS" >>"$csv"
			done
			# the case's summary: the fastest fitting point, the plan's rank among the fitting points
			awk -F, -v c="$name" -v b="$budget" '$1 == c && $2 == b && $12 == "yes" { print }' "$csv" | sort -t, -k10,10g >"$WORK/fit.csv"
			awk -F, -v c="$name" -v b="$budget" -v pargs="$pargs" '
				$3 == "plan" { pm = $10; pp = $11; pf = $12 }
				NR == 1 { bm = $10; bp = $3 "/" $4 "/S" $5 "/T" $6 "/mb" $7 "/rc:" $8 "/split:" $9 }
				{ ms[NR] = $10 }
				END {
					rank = 0
					if (pm != "") { rank = 1; for (i = 1; i <= NR; i++) if (ms[i] < pm) rank++ }
					printf "%s,%s,%s,%s,%s,%s,%s,%s,%.3f,%d,%d\n", c, b, pargs, pm, pp, pf, bp, bm, pm / bm, rank, NR
				}' "$WORK/fit.csv" | tee -a "$sum"
		done
	done
	echo "planner_grid: grid in $csv, summary in $sum"
fi

if part 2; then
	csv=$OUT/planner-issue.csv
	L=$(($(echo "$ISSUE" | tr , '\n' | wc -l) - 1))
	plan "$ISSUE" "$ISSUE_BATCH" || { echo "planner_grid: issue: $(cat "$WORK/plan.err")" >&2; exit 1; }
	mb=$(jq -r '.plan.mb' "$WORK/plan.json") T=$(jq -r '.plan.threads' "$WORK/plan.json")
	state=$(jq -r '.plan.state_bytes' "$WORK/plan.json")
	S=$T
	[ "$S" -le "$L" ] || S=$L
	point "$ISSUE" "$ISSUE_BATCH" --stages "$S" --threads "$T" --schedule 1f1b --mb "$mb" --recompute none --hand-over off
	[ "$MS" != n/a ] || { echo "planner_grid: issue: 1F1B keeping everything: $(cat "$WORK/p.err")" >&2; exit 1; }
	act=$ACT
	budget=$((state + act / 2))
	echo "planner_grid: issue: 1F1B at $mb rows on $S stages keeps $act activation bytes; budget $budget (state $state + half)"
	if ! plan "$ISSUE" "$ISSUE_BATCH" "$budget"; then
		# no plan fits half: say so, and compare at the least budget that any plan fits
		why=$(tail -1 "$WORK/plan.err")
		plan "$ISSUE" "$ISSUE_BATCH" || exit 1
		budget=$(jq -r '.plan.smallest_budget_bytes' "$WORK/plan.json")
		echo "planner_grid: issue: no plan fits that budget ($why); the least that fits instead: $budget"
		plan "$ISSUE" "$ISSUE_BATCH" "$budget" || { echo "planner_grid: issue: $(cat "$WORK/plan.err")" >&2; exit 1; }
	fi
	pargs=$(plan_args)
	base="--stages $S --threads $T --schedule 1f1b --mb $mb --recompute all --hand-over off"
	[ "$S" -le 1 ] || base="$base --split $(uniform_split "$L" "$S")"
	echo "planner_grid: issue: plan $pargs; baseline $base"
	echo "arm,round,step_ms,peak_bytes,fits,others_cpus" >"$csv"
	for r in $(seq 1 "$ROUNDS"); do
		for arm in plan base; do
			if [ $arm = plan ]; then a=$pargs; else a=$base; fi
			# shellcheck disable=SC2086 # a list of options
			point "$ISSUE" "$ISSUE_BATCH" $a
			peak_fits "$state" "$budget"
			echo "$arm,$r,$MS,$PEAK,$FITS,$OTHERS" >>"$csv"
		done
	done
	cat "$csv"
	pm=$(awk -F, '$1 == "plan" { print $3 }' "$csv" | sort -g | awk "$median")
	bm=$(awk -F, '$1 == "base" { print $3 }' "$csv" | sort -g | awk "$median")
	paired=$(awk -F, '$1 == "plan" { p[$2] = $3 } $1 == "base" { b[$2] = $3 } END { for (r in p) if (p[r] > 0) print b[r] / p[r] }' "$csv" | sort -g | awk "$median")
	echo "planner_grid: issue: plan $pm ms, uniform split all recomputing $bm ms: $(awk -v p="$pm" -v b="$bm" 'BEGIN { printf "%.2f", b / p }')x (paired $paired); budget $budget"
fi
echo "planner_grid: load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
