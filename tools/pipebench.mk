# pipebench: filled in by its work.
