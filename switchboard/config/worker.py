"""One worker process's settings (`[worker]`): the models it may hold and its memory, its job slots
and their shares, chunk coalescing, how engines start, and how jobs of dead workers are taken over."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

# How a vLLM engine's process starts (see `WorkerConfig.engine_process`, whose default is the one).
EngineProcess = Literal["fork", "spawn"]


class WorkerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One worker process."""

    # Names of the models this worker may hold; empty means every configured model.
    models: list[str] = msgspec.field(default_factory=list)
    # Models held at once (warm, loading or asleep), whatever the memory budget says.
    max_loaded_models: Annotated[int, msgspec.Meta(ge=1)] = 3
    # Memory the worker's models may take together (GiB): GPU memory on GPU workers, RAM on CPU
    # workers. None takes 90% of the GPU's memory, or 80% of the RAM available at start.
    memory_budget_gib: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # What kind of machine this is, for the load times measured per model and kind (None: the GPU's
    # name, or "cpu").
    kind: str | None = None
    # A model that was loaded stays at least this long before another model may evict it ...
    min_residency_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    # ... unless a job of the evicting model has waited longer than this (no job waits forever).
    max_pass_over_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # After a failed load, the model is not tried again for this long; it doubles with each
    # failure in a row, up to load_backoff_max_s.
    load_backoff_s: Annotated[float, msgspec.Meta(gt=0)] = 15.0
    load_backoff_max_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # How often the model controller looks at demand when nothing pokes it.
    controller_tick_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Jobs this worker runs at once, across its models (the engine batches them); a model never runs
    # more than its engine batches (vLLM's max_num_seqs), the rest wait in its stream for any worker.
    # Pooling models' jobs hold none of these: they last milliseconds, and their batches bound them.
    max_concurrent_jobs: Annotated[int, msgspec.Meta(ge=1)] = 64
    # Share those slots among the warm models (a reserve each, then by priority and weight: see
    # `models.*.priority`); false: one pool, taken in turn, so that one model's flood can hold them all.
    fair_shares: bool = True
    # With fair shares: while several models run jobs here, the engine processes of one running more
    # than its share (or of a lower priority) compute at this nice value, so that the others' jobs
    # get the cores first (workers/runtime/cpu_priority.py); needs CAP_SYS_NICE to give the normal
    # priority back, without it the worker says so and leaves them alone. false: never.
    cpu_priorities: bool = True
    background_nice: Annotated[int, msgspec.Meta(ge=1, le=19)] = 10
    # Shadow copies of routed requests (`routes.*.shadow`) run here at once, at most, and only while
    # no real job waits; None: a quarter of max_concurrent_jobs.
    max_shadow_jobs: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # The Batch API's lines (the batch tier) run here at once, at most; None: half of
    # max_concurrent_jobs. They take only slots no interactive job wants: none while any warm model
    # has interactive jobs waiting, never a warm model's last slot nor its engine's last sequence.
    max_batch_jobs: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # While interactive jobs run here, batch lines start only while fewer than this many run; None:
    # an eighth of max_batch_jobs (at least 1). Every sequence an engine runs slows each step of
    # the others a little (on a CPU, in proportion), and so the interactive jobs' first tokens:
    # `make bench-batch` measures what a batch costs them at each setting.
    batch_jobs_beside_interactive: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # Tokens that reach the Triton callable within this window travel as one chunk. Every hop
    # after the engine costs CPU per chunk, so with many streams the window widens, up to
    # coalesce_max_ms, to keep each model under max_chunks_per_s in total.
    # The floor is about one display frame: nobody sees finer steps, and on a small box fewer
    # chunks leave the engine's scheduler more CPU (1.5x tokens/s for one stream, measured).
    coalesce_ms: Annotated[float, msgspec.Meta(ge=0)] = 15.0
    # The default budget keeps a 2-core box's front door and worker from drowning in chunks at 32
    # streams (a window of 160 ms); raise it where more cores serve the messages.
    coalesce_max_ms: Annotated[float, msgspec.Meta(ge=0)] = 200.0
    max_chunks_per_s: Annotated[float, msgspec.Meta(gt=0)] = 200.0
    heartbeat_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    # Cores kept free of engine compute on CPU workers, for Triton, the consumer and the router; a
    # CPU worker runs its own threads and Triton on these (the last cores of its affinity).
    reserved_cores: Annotated[int, msgspec.Meta(ge=0)] = 1
    # KV cache per engine on CPU workers (GiB); vLLM's CPU build refuses to start without room.
    cpu_kvcache_gib: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # How a vLLM engine's process starts. "fork": forked from a helper process that imported vLLM
    # once at worker start (a cold load in about 2 s instead of 9 on a small CPU box, for about
    # 0.6 GiB held by the helper); vLLM versions or platforms it is not proven on (GPUs) fall back
    # to "spawn" with a warning. "spawn": vLLM's own way, a new interpreter per engine.
    engine_process: EngineProcess = "fork"
    # A job whose worker died is put back in line for another worker, which continues its answer
    # where the client's stream stopped; a job taken this many times (every worker died under it)
    # is given up: its client gets an error and the job goes to the dead-letter stream.
    max_deliveries: Annotated[int, msgspec.Meta(ge=1)] = 3
    # How often a worker looks for jobs left by dead workers on the streams of its models.
    takeover_check_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    # A job whose front door has been gone this long, and whose stream no client resumed through
    # another front door, is cancelled: nobody would read the rest of its answer.
    orphan_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # Seconds a worker waits for running jobs to finish when told to stop; what is still running
    # then is put back in line for another worker.
    drain_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # The worker's Prometheus metrics (its own, then its Triton's) at http://HOST:PORT/metrics: the
    # first free port from metrics_port on (64 are tried, so several workers on one machine each
    # get one); 0 takes any free port. The port taken is logged and in the worker's record.
    metrics_host: str = "127.0.0.1"
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9180
    # Where the demo model is built when no model is configured.
    demo_model_dir: str = "~/.cache/switchboard/demo-model"
    # The node cache of remote models' files (`s3://`, `hf://`): one folder per host, shared by every
    # worker there (a model's files are fetched once per host), the least recently used models' files
    # leaving when a new model needs room. None: no budget beyond the disk's free space.
    model_cache_dir: str = "~/.cache/switchboard/models"
    model_cache_gib: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # A cached model at a revision that can move (a Hub branch, a bucket prefix) is listed again at a
    # load at most this often; between listings a load uses the cached files without asking the store.
    source_recheck_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    # Files of one model fetched at once.
    download_concurrency: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
