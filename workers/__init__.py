"""The worker: one process that takes jobs from Redis and runs them on the models it holds."""
