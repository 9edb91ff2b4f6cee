"""The text formats: the trajectory model (the only code that writes or parses tags), token counting, prompt format."""
