"""Model builders for tests and benchmarks. They download nothing."""
