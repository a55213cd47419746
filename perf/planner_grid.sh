#!/bin/sh
# Where the planner's choice ranks (issue 24). Not a test; run it on a quiet machine (a full run: about
# 25 minutes on 2 quiet cores, some 140 points kept of 1200 and 600 runs; DRY=1 counts them first).
#
#   1. the grid: for each case (a model shape and a budget) the plan of `pipetrain --plan auto --memory
#      BUDGET --plan-only --json`, and from the same profile the planner's prediction of every point of
#      the grid it searches (--plan-points): threads 1 .. CPUS, each schedule (gpipe, 1f1b, zbh1, zbh2 on
#      T stages; interleaved, looped-bfs, zbv, dualpipev on 2T), each profiled micro-batch size,
#      recomputation none, all and the plan's stages, split uniform (whole layers spread evenly) and the
#      plan's (the plan's own point is the plan's row). Left out (pruned): points predicted slower than
#      PRUNE (1.5) x the fastest point predicted to fit, points the planner cannot weigh (a placement the
#      schedule refuses), and points predicted above PEAK_SLACK (1.0) x the budget (the planner's
#      activations bound the trainer's from above and equalled them in every run so far, so such a
#      point cannot be the best that fits; PEAK_SLACK=100 measures them anyway); never the plan. The
#      rest are measured ROUNDS times, interleaved (one pass over the points a round, every other round
#      backwards), each run WARM unmeasured and STEPS measured steps (--log: its median step); a point's
#      step is the median of its rounds, its peak memory the trainer's highest activation peak + the
#      plan's state (parameters, gradients, optimizer moments). Then the FINAL fastest points within the
#      budget and the plan are measured FINAL_ROUNDS more times, interleaved, and ranked on those runs
#      alone: the plan's step over the best (the target: within 5 %), the same paired (the median over the
#      final rounds of the plan's run over the best point's in that round) and its rank. One CSV per case
#      (planner-grid-SHAPE-BUDGET.csv, a row per point, pruned ones with their predictions only), the
#      summary (planner-grid-summary.csv) and its table on standard output;
#   2. the issue's case: 784-2048x6-10, batch 1024, a budget of the state plus half the activations that
#      1F1B needs at the plan's micro-batch keeping every one (measured), the plan against the uniform
#      split with every stage recomputing (1F1B at the same micro-batch and threads), alternated ROUNDS
#      times, medians and the paired ratio (the target: at least 1.2; planner-issue.csv).
#
# Cases: CASES, space-separated "name:widths:batch"; each runs under two budgets, from the plan without a
# limit (its peak P) and the least memory any plan needs (N): "half" N + (P - N) / 2 and "eighth"
# N + (P - N) / 8; BUDGETS ("half eighth") names the ones to run, so that a case's miss can be measured
# again alone (CASES=uniform:784,512,512,512,512,512,10:256 BUDGETS=eighth PARTS=1).
# Usage (from the build directory): sh ../perf/planner_grid.sh [OUT_DIR]     (default ../perf/results)
#   or `make planner-grid` there.
# Environment: PIPETRAIN (tools/pipetrain/pipetrain), CASES (the three shapes below), BUDGETS ("half
#   eighth"), STEPS (16), WARM
#   (4), ROUNDS (3), FINAL (4), FINAL_ROUNDS (5), PRUNE (1.5), PEAK_SLACK (1.0), CPUS (nproc), PARTS
#   ("1 2"), SIZES (the micro-batch sizes of the grid; default the plan's profiled ones), ISSUE (the
#   issue's widths, "784,2048,2048,2048,2048,2048,2048,10"), ISSUE_BATCH (1024). DRY=1: plan and
#   predict, print each case's points (predicted step and peak, kept or pruned) and measure nothing.
#   QUICK=1: a tiny run that proves the script works (small models, two sizes, few steps; figures
#   meaningless).
set -eu
BIN=${PIPETRAIN:-tools/pipetrain/pipetrain}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=perf/others.sh
. "$here/others.sh"
OUT=${1:-$here/results}
STEPS=${STEPS:-16}
WARM=${WARM:-4}
ROUNDS=${ROUNDS:-3}
FINAL=${FINAL:-4}
FINAL_ROUNDS=${FINAL_ROUNDS:-5}
PRUNE=${PRUNE:-1.5}
PEAK_SLACK=${PEAK_SLACK:-1.0}
CPUS=${CPUS:-$(nproc)}
PARTS=${PARTS:-1 2}
DRY=${DRY:-0}
CASES=${CASES:-uniform:784,512,512,512,512,512,10:256 wide:784,256,2048,256,256,10:256 deep:784,128,128,128,128,128,128,128,128,128,128,128,128,10:256}
ISSUE=${ISSUE:-784,2048,2048,2048,2048,2048,2048,10}
ISSUE_BATCH=${ISSUE_BATCH:-1024}
SIZES=${SIZES:-}
BUDGETS=${BUDGETS:-half eighth}
for b in $BUDGETS; do
	case $b in half | eighth) ;; *) echo "planner_grid: BUDGETS: $b is not half or eighth" >&2; exit 2 ;; esac
done
if [ "${QUICK:-0}" = 1 ]; then
	CASES="uniform:784,32,32,32,10:64 wide:784,16,96,16,10:64 deep:784,16,16,16,16,16,10:64"
	ISSUE=784,64,64,64,10 ISSUE_BATCH=64 SIZES=${SIZES:-16 32} STEPS=2 WARM=1 ROUNDS=2 FINAL=2 FINAL_ROUNDS=2
fi
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac }
command -v jq >/dev/null || { echo "planner_grid: jq not found (apt-get install jq)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "planner_grid: $BIN not built (make tools/pipetrain/pipetrain)" >&2; exit 2; }
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "planner_grid: $(nproc) CPUs (grid threads 1-$CPUS), load $(cut -d' ' -f1-3 /proc/loadavg) at start;" \
	"BUDGETS=\"$BUDGETS\" STEPS=$STEPS WARM=$WARM ROUNDS=$ROUNDS FINAL=$FINAL FINAL_ROUNDS=$FINAL_ROUNDS PRUNE=$PRUNE${DRY:+ DRY=$DRY}"
# shellcheck disable=SC2016 # an awk program
median='{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'

# plan WIDTHS BATCH [BUDGET [POINTS]]: the plan as JSON into $WORK/plan.json (0, or 2 when no plan
# fits), with the predictions of POINTS' lines (--plan-points) from the plan's own profile.
plan() {
	mem=${3:+--memory $3}
	pts=${4:+--plan-points $4}
	# shellcheck disable=SC2086 # mem and pts are an option and its value, or nothing
	"$BIN" --layers "$1" --batch "$2" --plan auto $mem $pts --plan-only --json --threads "$CPUS" \
		2>"$WORK/plan.err" >"$WORK/plan.json"
}

# uniform_split L S: the first layers of stages 1 .. S-1 when L layers are spread evenly ("-": one stage).
uniform_split() { awk -v L="$1" -v S="$2" 'BEGIN { if (S < 2) print "-"; else for (s = 1; s < S; s++) printf "%s%d%s", (s > 1 ? "," : ""), int(s * L / S), (s == S - 1 ? "\n" : "") }'; }

# layers_of L SPLIT STAGES: the layers of the recomputing stages (none, all, or stages "0,2") under the
# split, as pipetrain's --recompute takes them ("0-1,4-5"; none).
layers_of() {
	awk -v L="$1" -v sp="$2" -v rc="$3" 'BEGIN {
		S = 1; first[0] = 0
		if (sp != "-") { n = split(sp, c, ","); for (i = 1; i <= n; i++) first[S++] = c[i] }
		first[S] = L
		if (rc == "none" || rc == "all") { print rc; exit }
		n = split(rc, r, ","); out = ""
		for (i = 1; i <= n; i++) out = out (i > 1 ? "," : "") first[r[i]] "-" (first[r[i] + 1] - 1)
		print out
	}'
}

# point WIDTHS BATCH ARGS...: one run of WARM + STEPS steps; sets MS (the median of its measured steps,
# ms), ACT (the activation peak, bytes) and OTHERS (others.sh), or MS=n/a when pipetrain refused it.
point() {
	widths=$1 batch=$2
	shift 2
	rm -f "$WORK/log.csv"
	MS=n/a ACT=n/a
	if others_run "$BIN" --layers "$widths" --batch "$batch" --limit $((batch * (WARM + STEPS))) --val 0 \
		--epochs 1 --log "$WORK/log.csv" --json --quiet "$@" >"$WORK/p.json" 2>"$WORK/p.err"; then
		MS=$(awk -F, -v w="$WARM" 'NR > 1 + w { print $8 }' "$WORK/log.csv" | sort -g | awk "$median")
		ACT=$(jq -r '.peak_activation_bytes' "$WORK/p.json")
		[ -n "$MS" ] || MS=n/a
	fi
}

# peak_fits ACT STATE BUDGET: PEAK (ACT + STATE) and FITS (yes, no; n/a for a refused point).
peak_fits() {
	PEAK=n/a FITS=n/a
	[ "$1" = n/a ] || { PEAK=$(($1 + $2)); FITS=$([ "$PEAK" -le "$3" ] && echo yes || echo no); }
}

# The plan's own point from $WORK/plan.json: "SCHEDULE THREADS MB RECOMPUTE SPLIT" (--plan-points' form).
plan_point() {
	jq -r '.plan | "\(.schedule) \(.threads) \(.mb) " +
		(if all(.recompute[]; .) then "all" else [.recompute | to_entries[] | select(.value) | .key | tostring] |
			if length > 0 then join(",") else "none" end end) +
		" " + (if .stages > 1 then [.stage_layers[1:][] | .[0] | tostring] | join(",") else "-" end)' "$WORK/plan.json"
}

# run_args L K T MB RC SPLIT: pipetrain's options for a point (S from the kind and T).
run_args() {
	case $2 in gpipe | 1f1b | zbh1 | zbh2) _s=$3 ;; *) _s=$(($3 * 2)) ;; esac
	_a="--stages $_s --threads $3 --schedule $2 --mb $4 --recompute $(layers_of "$1" "$6" "$5") --hand-over off"
	[ "$6" = - ] || _a="$_a --split $6"
	echo "$_a"
}

# measure WIDTHS BATCH STATE BUDGET LIST ROUNDS TAG: ROUNDS interleaved passes over the points of LIST
# (lines "id k T mb rc split"), every other one backwards; a row "id round ms act fits others" each run,
# appended to $WORK/TAG.runs.
measure() {
	for r in $(seq 1 "$6"); do
		if [ $((r % 2)) = 1 ]; then cat "$5"; else sed '1!G;h;$!d' "$5"; fi >"$WORK/order"
		while read -r id k T mb rc sp; do
			# shellcheck disable=SC2046 # a list of options
			point "$1" "$2" $(run_args "$L" "$k" "$T" "$mb" "$rc" "$sp")
			peak_fits "$ACT" "$3" "$4"
			echo "$id $r $MS $ACT $FITS $OTHERS" >>"$WORK/$7.runs"
		done <"$WORK/order"
	done
}

if part 1; then
	sum=$OUT/planner-grid-summary.csv
	echo "case,budget,budget_bytes,plan,plan_step_ms,plan_peak_bytes,plan_fits,best_point,best_step_ms,plan_over_best_pct,plan_rank_final,final_points,plan_rank_grid,fitting_points,measured_points,pruned_points,others_cpus_max,plan_over_best_paired_pct" >"$sum"
	for c in $CASES; do
		name=${c%%:*} rest=${c#*:}
		widths=${rest%:*} batch=${rest##*:}
		L=$(($(echo "$widths" | tr , '\n' | wc -l) - 1))
		plan "$widths" "$batch" || { echo "planner_grid: $name: no plan: $(cat "$WORK/plan.err")" >&2; continue; }
		loose=$(jq -r '.plan.predicted_peak_bytes' "$WORK/plan.json") least=$(jq -r '.plan.smallest_budget_bytes' "$WORK/plan.json")
		sizes=${SIZES:-$(jq -r '.plan.sizes | map(tostring) | join(" ")' "$WORK/plan.json")}
		for bname in $BUDGETS; do
			frac=$([ "$bname" = half ] && echo 2 || echo 8)
			budget=$(awk -v n="$least" -v p="$loose" -v f="$frac" 'BEGIN { printf "%.0f", n + (p - n) / f }')
			plan "$widths" "$batch" "$budget" || { echo "planner_grid: $name: $(cat "$WORK/plan.err")" >&2; continue; }
			pS=$(jq -r '.plan.stages' "$WORK/plan.json")
			# shellcheck disable=SC2046 # its five fields
			set -- $(plan_point)
			pk=$1 pT=$2 pmb=$3 prc=$4 psp=$5
			# the points, "k T mb rc split" a line, the plan's own first; then their predictions
			echo "$pk $pT $pmb $prc $psp" >"$WORK/points"
			for T in $(seq 1 "$CPUS"); do
				for k in gpipe 1f1b zbh1 zbh2 interleaved looped-bfs zbv dualpipev; do
					case $k in gpipe | 1f1b | zbh1 | zbh2) S=$T ;; *) S=$((2 * T)) ;; esac
					[ "$S" -le "$L" ] || continue
					splits=$(uniform_split "$L" "$S")
					[ "$S" != "$pS" ] || [ "$psp" = "$splits" ] || splits="$splits $psp"
					rcs="none all"
					[ "$S" != "$pS" ] || [ "$prc" = none ] || rcs="$rcs $prc"
					for mb in $sizes; do
						for rc in $rcs; do
							for sp in $splits; do
								# the plan's own point is the plan's row
								[ "$k $T $mb $rc $sp" = "$pk $pT $pmb $prc $psp" ] ||
									echo "$k $T $mb $rc $sp" >>"$WORK/points"
							done
						done
					done
				done
			done
			plan "$widths" "$batch" "$budget" "$WORK/points" || { echo "planner_grid: $name: $(cat "$WORK/plan.err")" >&2; continue; }
			state=$(jq -r '.plan.state_bytes' "$WORK/plan.json")
			# "id k T mb rc split pred_ms pred_peak pred_fits" a point: id plan for the first line
			jq -r '.points[] | "\(.line) \(.predicted_step_ms // "n/a") \(.predicted_peak_bytes // "n/a") \(if .fits == null then "n/a" elif .fits then "yes" else "no" end)"' \
				"$WORK/plan.json" >"$WORK/pred"
			awk 'NR == FNR { p[$1] = $2 " " $3 " " $4; next } { print (FNR == 1 ? "plan" : "p" FNR), $0, p[FNR] }' \
				"$WORK/pred" "$WORK/points" >"$WORK/table"
			best=$(awk '$9 == "yes" && $7 != "n/a" { print $7 }' "$WORK/table" | sort -g | head -1)
			# kept: the plan, and every point the planner can weigh within PRUNE x the best that fits and
			# predicted within PEAK_SLACK x the budget
			awk -v b="$best" -v f="$PRUNE" -v m="$budget" -v ps="$PEAK_SLACK" '
				{ keep = $1 == "plan" || ($7 != "n/a" && $7 <= f * b && $8 <= ps * m); print $0, keep ? "kept" : "pruned" }' \
				"$WORK/table" >"$WORK/table2"
			mv "$WORK/table2" "$WORK/table"
			nk=$(awk '$10 == "kept"' "$WORK/table" | wc -l) np=$(awk '$10 == "pruned"' "$WORK/table" | wc -l)
			echo "planner_grid: $name, budget $bname ($budget bytes): plan $pk on $pS stages, $pT threads, mb $pmb," \
				"recompute $prc, split $psp; $nk points kept, $np pruned (predicted above $PRUNE x $best ms," \
				"or above $PEAK_SLACK x the budget)"
			if [ "$DRY" = 1 ]; then
				echo "point schedule threads mb recompute split predicted_ms predicted_peak fits_predicted kept"
				cat "$WORK/table"
				continue
			fi
			awk '$10 == "kept" { print $1, $2, $3, $4, $5, $6 }' "$WORK/table" >"$WORK/kept"
			tag=$name-$bname
			: >"$WORK/$tag.runs"
			measure "$widths" "$batch" "$state" "$budget" "$WORK/kept" "$ROUNDS" "$tag"
			# per point: the median of its rounds, its highest activation peak, the most others took
			awk '$3 != "n/a" { print $1, $3 }' "$WORK/$tag.runs" | sort -k1,1 -k2,2g | awk '
				{ v[$1] = v[$1] " " $2; n[$1]++ }
				END { for (i in v) { m = split(substr(v[i], 2), x, " "); print i, (m % 2) ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2 } }' |
				sort -k1,1 >"$WORK/$tag.ms"
			awk -v s="$state" -v b="$budget" '$4 != "n/a" { if (!($1 in a) || $4 > a[$1]) a[$1] = $4 }
				{ if (!($1 in o) || $6 > o[$1]) o[$1] = $6 }
				END { for (i in o) { pk = (i in a) ? a[i] + s : "n/a"; print i, pk, pk == "n/a" ? "n/a" : (pk <= b ? "yes" : "no"), o[i] } }' \
				"$WORK/$tag.runs" | sort -k1,1 >"$WORK/$tag.peak"
			# the final: the FINAL fastest fitting points and the plan, FINAL_ROUNDS more passes
			join "$WORK/$tag.peak" "$WORK/$tag.ms" | awk '$3 == "yes" && $1 != "plan" { print $5, $1 }' | sort -g |
				head -n "$FINAL" | awk '{ print $2 }' >"$WORK/final.ids"
			echo plan >>"$WORK/final.ids"
			awk 'NR == FNR { f[$1] = 1; next } ($1 in f)' "$WORK/final.ids" "$WORK/kept" >"$WORK/final"
			: >"$WORK/$tag-final.runs"
			measure "$widths" "$batch" "$state" "$budget" "$WORK/final" "$FINAL_ROUNDS" "$tag-final"
			awk '$3 != "n/a" { print $1, $3 }' "$WORK/$tag-final.runs" | sort -k1,1 -k2,2g | awk '
				{ v[$1] = v[$1] " " $2 }
				END { for (i in v) { m = split(substr(v[i], 2), x, " "); print i, (m % 2) ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2 } }' >"$WORK/$tag-final.ms"
			# the case's CSV: a row per point
			csv=$OUT/planner-grid-$tag.csv
			echo "point,schedule,threads,mb,recompute_stages,split,predicted_step_ms,predicted_peak_bytes,predicted_fits,kept,round_step_ms,step_ms,peak_bytes,fits,final_step_ms_runs,final_step_ms,others_cpus" >"$csv"
			while read -r id k T mb rc sp pm pp pf kept; do
				rounds=$(awk -v i="$id" '$1 == i { printf "%s%s", (n++ ? "+" : ""), $3 }' "$WORK/$tag.runs")
				ms=$(awk -v i="$id" '$1 == i { print $2 }' "$WORK/$tag.ms")
				pk=$(awk -v i="$id" '$1 == i { print $2, $3, $4 }' "$WORK/$tag.peak")
				fr=$(awk -v i="$id" '$1 == i { printf "%s%s", (n++ ? "+" : ""), $3 }' "$WORK/$tag-final.runs")
				fm=$(awk -v i="$id" '$1 == i { print $2 }' "$WORK/$tag-final.ms")
				# shellcheck disable=SC2086 # three fields
				set -- ${pk:-n/a n/a n/a}
				echo "$id,$k,$T,$mb,$(echo "$rc" | tr , +),$(echo "$sp" | tr , +),$pm,$pp,$pf,$kept,$rounds,${ms:-n/a},$1,$2,$fr,${fm:-n/a},$3" >>"$csv"
			done <"$WORK/table"
			# the summary: the plan against the best fitting point of the final, and its rank in the grid
			awk -F, -v c="$name" -v bn="$bname" -v b="$budget" '
				NR == 1 { next }
				$1 == "plan" { pm = $16; pp = $13; pf = $14; pg = $12; pr = $15; plan = $2 "/T" $3 "/mb" $4 "/rc:" $5 "/split:" $6 }
				$10 == "kept" { measured++; if ($17 != "n/a" && $17 > om) om = $17 }
				$10 == "pruned" { pruned++ }
				$14 == "yes" && $12 != "n/a" { fit[++nf] = $12 }
				$14 == "yes" && $16 != "n/a" { if (bm == "" || $16 < bm) { bm = $16; br = $15; best = $1 "=" $2 "/T" $3 "/mb" $4 "/rc:" $5 "/split:" $6 }; fin[++nfin] = $16 }
				END {
					rf = 0; rg = 0
					if (pm != "n/a" && pm != "") { rf = 1; for (i = 1; i <= nfin; i++) if (fin[i] < pm) rf++ }
					if (pg != "n/a" && pg != "") { rg = 1; for (i = 1; i <= nf; i++) if (fit[i] < pg) rg++ }
					over = (bm != "" && pm != "n/a" && pm != "") ? sprintf("%.1f", (pm / bm - 1) * 100) : "n/a"
					# paired: the median over the final rounds of the plan run over the best point run in
					# the same round (both measured once a round, so a drift of the machine cancels)
					n = 0; np = split(pr, a, "+"); split(br, x, "+")
					for (i = 1; i <= np; i++) if (a[i] != "n/a" && x[i] != "n/a" && x[i] > 0) q[++n] = a[i] / x[i]
					for (i = 2; i <= n; i++) for (j = i; j > 1 && q[j - 1] > q[j]; j--) { t = q[j]; q[j] = q[j - 1]; q[j - 1] = t }
					paired = n ? sprintf("%.1f", (((n % 2) ? q[(n + 1) / 2] : (q[n / 2] + q[n / 2 + 1]) / 2) - 1) * 100) : "n/a"
					printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%d,%d,%d,%d,%d,%d,%.2f,%s\n", c, bn, b, plan, pm, pp, pf, best, bm, over, rf, nfin, rg, nf, measured, pruned, om, paired
				}' "$csv" >>"$sum"
		done
	done
	if [ "$DRY" != 1 ]; then
		echo "planner_grid: the plan against the best fitting point (final rounds); CSVs in $OUT/planner-grid-*.csv"
		printf '%-8s %-6s %10s %10s %8s %8s %6s %6s %7s %s\n' case budget plan_ms best_ms over_% paired_% rank fits others best
		awk -F, 'NR > 1 { printf "%-8s %-6s %10s %10s %8s %8s %3d/%-2d %6s %7s %s\n", $1, $2, $5, $9, $10, $18, $11, $12, $7, $17, $8 }' "$sum"
		echo "planner_grid: others: the most CPUs other processes took during one run of the case (0 on a quiet machine)"
	fi
fi

if part 2 && [ "$DRY" != 1 ]; then
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
	# shellcheck disable=SC2046 # its five fields
	set -- $(plan_point)
	pargs=$(run_args "$L" "$1" "$2" "$3" "$4" "$5")
	base="--stages $S --threads $T --schedule 1f1b --mb $mb --recompute all --hand-over off"
	[ "$S" -le 1 ] || base="$base --split $(uniform_split "$L" "$S")"
	echo "planner_grid: issue: plan $pargs; baseline $base"
	echo "arm,round,step_ms,peak_bytes,fits,others_cpus" >"$csv"
	for r in $(seq 1 "$ROUNDS"); do
		for arm in plan base; do
			if [ $arm = plan ]; then a=$pargs; else a=$base; fi
			# shellcheck disable=SC2086 # a list of options
			point "$ISSUE" "$ISSUE_BATCH" $a
			peak_fits "$ACT" "$state" "$budget"
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
