"""The developer harness: the benchmark, the soak run and the dispatch-policy simulator (not the
serving path, not user commands)."""
