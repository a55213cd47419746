# perf model: filled in by its work.
