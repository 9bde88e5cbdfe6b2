"""What a person watching a job sees: the live view and progress lines, `regen status`,
the metrics."""
