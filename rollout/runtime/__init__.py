"""Where work runs: the shard worker, the Ray actor pool, the job runner and its manifest."""
