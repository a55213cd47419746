# The planner against the full grid it searches (issue 24): perf/planner_grid.sh runs every point with
# pipetrain and ranks the plan (a quiet machine: `make planner-grid`, results in perf/results).
EXTRA_DIST += perf/planner_grid.sh
planner-grid: tools/pipetrain/pipetrain
	sh $(srcdir)/perf/planner_grid.sh
.PHONY: planner-grid
