"""A job's runs: the pipeline of `regen run`, and `regen plan`'s forecast."""
