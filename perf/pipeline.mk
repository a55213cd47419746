# perf pipeline: filled in by its work.
