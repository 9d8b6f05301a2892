"""What the worker process runs on: heartbeat, machine, CPU placement, footprints, metrics."""
