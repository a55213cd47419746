# perf pool: filled in by its work.
