"""Running Switchboard on one machine: the all-in-one stack, its parts, and the demo model.

Not part of the shared core: nothing in `router/` or `workers/` needs these at run time, except the
worker building the demo model on first use.

- `launcher.py`: start N workers and the front door, wait for `/readyz`, stop in reverse;
- `stack.py`: `switchboard up` on top of the launcher;
- `redis_server.py`: a private redis-server on a free port;
- `processes.py`: child processes stopped together with everything they started;
- `demo_model.py`: the tiny random-weight model that demos, tests and benchmarks serve;
- `demo_pooling_models.py`: a tiny random-weight embedder, classifier and cross-encoder reranker;
- `toml_text.py`: settings written back as TOML, for the configuration files the tools hand to children.
"""
