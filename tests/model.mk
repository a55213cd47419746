# Model tests: filled in by the model work.
