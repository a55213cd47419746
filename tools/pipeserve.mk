# pipeserve: filled in by its work.
