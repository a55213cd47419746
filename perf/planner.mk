# The planner against the full grid it searches (issue 24): perf/planner_grid.sh predicts every point
# from the plan's profile, prunes the slow and the too large, measures the rest with pipetrain in
# interleaved rounds, then the fastest again, and ranks the plan (a quiet machine, about 25 minutes:
# `make planner-grid`, results in perf/results; DRY=1 lists the points, QUICK=1 is a smoke run).
EXTRA_DIST += perf/planner_grid.sh
planner-grid: tools/pipetrain/pipetrain
	sh $(srcdir)/perf/planner_grid.sh
.PHONY: planner-grid
