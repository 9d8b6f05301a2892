"""What the front door records: each request's span and timings, each job's, and its Prometheus metrics."""
