"""The long-running service: a durable job store and the job manager that runs jobs."""
