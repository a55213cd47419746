# perf ring: filled in by its work.
