"""Every Redis key Switchboard writes, with its lifetime next to it.

Nothing else in the code spells a key name by hand: reliability tests audit these families, and a
change of layout happens here alone. All keys live under one prefix so several deployments can
share a Redis server.

Hash tags (the part of a key inside `{}`, which alone decides a Redis Cluster's slot):
- every key of one model carries the model's name as its tag (`sb:model:{<name>}:jobs`), so that a
  cluster could later hold different models on different shards: the job stream, the replica
  leases, the failure mark, the desired state, the measured costs and the limits;
- every key of one job carries the job's id (`sb:job:{<id>}:out`): its result stream, cancel mark
  and record, which its scripts (`cancel.lua`, `resume.lua`) touch together;
- the deployment-wide keys have no tag: the workers index and records, the demand stream and the
  demand index, the catalogue version, the API keys and their limits (and the token counters of
  keys and teams), the in-flight set, the dead letters, the front doors' keys. No script touches
  two models' keys; those that reach past one model's touch the job's own keys or these
  deployment-wide ones (`enqueue.lua`: the job's record, the demand index and stream; `admit.lua`:
  the API key's limits, its and its team's token counters, and the in-flight set;
  `append_chunk.lua`: the job's keys, its model's job stream and its front door's inbox). In a
  Redis Cluster those writes would leave the scripts for commands pipelined beside them
  (`lua.ScriptRunner`); today they stay inside, where they are atomic with the job's append and
  cost no reply of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Set once at process start from `redis.key_prefix` (see `set_prefix`); every key below reads it.
PREFIX = "sb"
PREFIX_PATTERN = r"^[A-Za-z0-9._-]+(:[A-Za-z0-9._-]+)*$"

# Consumer group that every worker joins on each model's job stream.
JOB_GROUP = "workers"

# A model's job stream outlives its last enqueue by this long, so a model that is no longer
# configured leaves nothing behind. Workers recreate the consumer group if it expired.
JOB_STREAM_TTL_S = 7 * 24 * 3600

# A result stream lives until its reader has drained it (the front door deletes it), or at most
# this long after its last chunk: long enough for a slow reader, short enough to bound leaks.
RESULT_TTL_S = 600

# A cancel mark outlives any job that could still be running for it.
CANCEL_TTL_S = 600

# A worker that misses heartbeats for this long is no longer counted as alive, and the jobs it
# took become another worker's.
WORKER_TTL_S = 15

# Jobs given up on (an entry that cannot be decoded, a job whose workers all died under it), kept
# for an operator to look at: the newest few thousand, for a week after the last one.
DEAD_LETTER_MAXLEN = 10_000
DEAD_LETTER_TTL_S = 7 * 24 * 3600

# A front door's inbox (`inbox`) only needs to exist while that front door runs; what it has read
# it trims, and a writer keeps it to about this many entries whatever happens to its reader (one
# that falls this far behind reads the jobs' result streams themselves: nothing is lost).
INBOX_TTL_S = 60
INBOX_MAX_ENTRIES = 10_000

# A replica lease is renewed by its holder on every controller pass; a holder that dies loses it
# this long after its last renewal, and another worker may then add that replica.
REPLICA_LEASE_TTL_S = 10

# Measured load, wake and sleep times per model and worker kind: the last few samples, kept a month.
COST_SAMPLES = 16
COST_TTL_S = 30 * 24 * 3600

# An operator's load/unload request is seen by every controller within this time.
DESIRED_TTL_S = 120
# An operator's prefetch request: every live worker sees it within seconds; one that starts within
# this time fetches too.
PREFETCH_TTL_S = 600

# A model's limits (context length, vocabulary) outlive its loads: the front door checks requests
# against them while it is cold too.
MODEL_LIMITS_TTL_S = 30 * 24 * 3600

# The demand stream only carries pokes; a few hundred recent entries are plenty.
DEMAND_MAXLEN = 256
DEMAND_TTL_S = 3600

# The demand index lives as long as the job streams it points to (each enqueue renews both).
DEMAND_INDEX_TTL_S = JOB_STREAM_TTL_S

# The catalogue version outlives the facts it versions (measured costs live COST_TTL_S).
CATALOGUE_VERSION_TTL_S = COST_TTL_S


# A request holds its in-flight slot at most this long past its deadline: a front door that dies
# without releasing its slots loses them then.
SLOT_GRACE_S = 30


# Field names inside the records and stream entries above. Lua scripts (switchboard/lua/) receive
# them as they are spelled here; Python code uses these constants, never the bare strings.
# A job stream entry: the msgpack Job, and on a job put back in line, how often it was taken before.
JOB_FIELD = "job"
TAKEN_FIELD = "taken"
# A result stream entry: the msgpack Chunk, and the id of the worker that wrote it (the fence).
CHUNK_FIELD = "c"
WRITER_FIELD = "w"
# ... and on a writer's first chunk, the model it ran the job on (the job record's `model` then).
SERVED_BY_FIELD = "m"
# A job record (`job_record`): the key that sent it, clients reading it now, times it was resumed,
# set once its last chunk was written, and the model it is queued for (moved by a route's rollback).
TENANT_FIELD = "tenant"
MODEL_RECORD_FIELD = "model"
READERS_FIELD = "readers"
RESUMES_FIELD = "resumes"
DONE_FIELD = "done"
# ... and times a streamed client left it mid-stream: a job is given up once the resume grace of the
# last one passes with no reader back (`lua/give_up.lua`). Its `tenant` is the identity of the key
# (the SHA-256 of its secret), never its name, which another key could take.
LEAVES_FIELD = "leaves"
# ... the tokens its answer was estimated at when it was admitted: what a resume reserves.
ANSWER_TOKENS_FIELD = "answer_tokens"
# A demand poke: the model it is about ("" for any).
MODEL_FIELD = "m"
# A wake poke in a front door's inbox carries nothing; a copy of a result chunk carries the result
# stream it was appended to, its entry id there, and the entry's chunk (and model) fields.
WAKE_FIELD = "w"
INBOX_STREAM_FIELD = "r"
INBOX_ENTRY_FIELD = "e"


def set_prefix(prefix: str) -> None:
    """Put every key of this process under `prefix` (call once, before any key is made)."""
    global PREFIX
    if not re.fullmatch(PREFIX_PATTERN, prefix):
        raise ValueError(
            f"invalid key prefix {prefix!r}: letters, digits, '.', '_', '-', parts joined by ':'"
        )
    PREFIX = prefix


def _model(model: str) -> str:
    """The start of every key of `model`: its name is the hash tag they share."""
    return f"{PREFIX}:model:{{{model}}}"


def _job(job_id: str) -> str:
    """The start of every key of one job: its id is the hash tag they share."""
    return f"{PREFIX}:job:{{{job_id}}}"


def job_stream(model: str, tier: str = "default") -> str:
    """The stream of `model`'s jobs of one tier (`wire.TIERS`), shared by every worker that serves it.
    The default tier's is the model's own `jobs` stream; the others are beside it."""
    return f"{_model(model)}:jobs" if tier == "default" else f"{_model(model)}:jobs:{tier}"


def job_streams(model: str, tiers: Iterable[str]) -> list[str]:
    """The streams of `model`'s jobs of each of `tiers` (`wire.TIERS`: all, in the order they are served)."""
    return [job_stream(model, tier) for tier in tiers]


def result_stream(job_id: str) -> str:
    """The stream of result chunks of one job, read from its start by the front door."""
    return f"{_job(job_id)}:out"


def cancel_mark(job_id: str) -> str:
    """Set when the client has gone away; the worker stops generating for that job."""
    return f"{_job(job_id)}:cancel"


def dead_letter_stream() -> str:
    """Jobs no worker could run, with the reason (fields: job, stream, entry, reason, worker)."""
    return f"{PREFIX}:dead-letter"


def worker_record(worker_id: str) -> str:
    """One worker's advertisement (a msgpack WorkerRecord), refreshed by its heartbeat."""
    return f"{PREFIX}:worker:{worker_id}"


def workers_index() -> str:
    """Sorted set of worker ids scored by their last heartbeat (unix seconds)."""
    return f"{PREFIX}:workers"


def inbox(router_id: str) -> str:
    """The front door `router_id`'s inbox: a copy of every result chunk of the jobs it queued, which its
    result reader reads in one XREAD of one key (`router.queue.results`), and its wake pokes."""
    return f"{PREFIX}:router:{router_id}:inbox"


def replica_lease(model: str, replica: int) -> str:
    """Held (`SET NX PX`) by the worker that loads or holds replica `replica` of `model`."""
    return f"{_model(model)}:replica:{replica}"


def load_failure(model: str) -> str:
    """Set when the model's last load failed (a msgpack LoadFailure); expires when it may be retried."""
    return f"{_model(model)}:failure"


def desired_state(model: str) -> str:
    """An operator's load or unload request for the model (a msgpack DesiredState)."""
    return f"{_model(model)}:desired"


def prefetch_request(model: str) -> str:
    """An operator's request to fetch the model's files into every node cache (a msgpack
    DesiredState), apart from load and unload requests so that neither replaces the other."""
    return f"{_model(model)}:prefetch"


def measured_costs(model: str, kind: str, operation: str) -> str:
    """The last COST_SAMPLES durations (seconds) of `operation` (load, wake, sleep) on `kind` workers."""
    return f"{_model(model)}:cost:{kind}:{operation}"


def model_limits(model: str) -> str:
    """What the model accepts (a msgpack ModelLimits), written by the worker that loaded it last."""
    return f"{_model(model)}:limits"


def demand_stream() -> str:
    """Poked at enqueue and by admin requests, so that model controllers react at once."""
    return f"{PREFIX}:demand"


def demand_index() -> str:
    """Hash of the models with work: model name → the token of the last enqueue or operator request.

    A model is in it while its job stream holds any job (waiting or running) and while an
    operator's load request for it lives; controllers read only these models' queues (and those they
    hold), and remove an entry only if its token is unchanged (`lua/forget_demand.lua`).
    """
    return f"{PREFIX}:demand:models"


def catalogue_version() -> str:
    """A counter bumped whenever a slow-changing fact changes: a measured cost, a load failure, an
    operator's desired state. Controllers keep those facts and read them again only when it moved."""
    return f"{PREFIX}:catalogue:version"


def api_keys() -> str:
    """Hash of the API keys `switchboard keys add` made: SHA-256 of the secret → the key's record (JSON).

    Operator data: it has no expiry, and only `switchboard keys` writes it.
    """
    return f"{PREFIX}:api-keys"


def retired_key_names() -> str:
    """Set of the names of removed API keys, which a new key may not take (`switchboard keys`).

    Operator data, like `api_keys`: it has no expiry.
    """
    return f"{PREFIX}:api-keys:retired-names"


def key_rate(owner: str) -> str:
    """The request and token buckets of one API key, by its identity (`Caller.owner`: the SHA-256 of
    its secret, never its name, which a config may change); expires once both would be full again."""
    return f"{PREFIX}:api-key:{owner}:rate"


def key_in_flight(owner: str) -> str:
    """Sorted set of the requests one API key (by its identity, as `key_rate`) has in flight, scored
    by when each slot expires."""
    return f"{PREFIX}:api-key:{owner}:in-flight"


# A token quota's counter outlives its period by this long: last month's tokens can still be read
# all through the next month (`switchboard keys usage`), and a job that ends after its period's end
# still settles the counter it reserved on.
QUOTA_KEPT_S = 32 * 24 * 3600


def key_tokens(owner: str, period: str) -> str:
    """The tokens one API key (by its identity, as `key_rate`) used in one quota period (`day:2025-01-31`
    or `month:2025-01`, UTC: `switchboard.quotas.Periods`), with its requests in flight counted at
    their estimate. Written only for a key with a quota or a team; expires QUOTA_KEPT_S after its
    period ends."""
    return f"{PREFIX}:api-key:{owner}:tokens:{period}"


def team_tokens(team: str, period: str) -> str:
    """The tokens the keys of team `team` (`auth.teams`) used together in one quota period, as
    `key_tokens` counts one key's; expires QUOTA_KEPT_S after its period ends."""
    return f"{PREFIX}:team:{team}:tokens:{period}"


def in_flight() -> str:
    """Sorted set of every request in flight across the front doors, scored by when each slot expires."""
    return f"{PREFIX}:in-flight"


def job_record(job_id: str) -> str:
    """Hash of what the front doors share about one job: `tenant` (the key that sent it, "" without
    keys), `readers` (clients reading its results right now) and `resumes` (times a client resumed
    its stream with `Last-Event-ID`); `leaves` (times a streamed client left it mid-stream) and
    `done` once its last chunk was written; `answer_tokens`, the estimate of its answer that a
    client resuming its stream reserves.

    Written when the job is queued, in the same script, which it also makes idempotent: a queueing
    retried after a lost reply finds the record and queues nothing twice. It lives until the job's
    deadline plus RESULT_TTL_S, and goes with the job's result stream when that is deleted or kept.
    """
    return _job(job_id)


# A streamed answer read to its end stays this long, for a client whose connection broke just
# before its last events arrived: it resumes with `Last-Event-ID` and gets them.
FINISHED_RESULT_TTL_S = 30


# A front door refreshes its heartbeat key this often; a front door silent this long is gone.
ROUTER_HEARTBEAT_S = 1.5
ROUTER_TTL_S = 5


def router_alive(router_id: str) -> str:
    """Exists while the front door `router_id` runs (refreshed every ROUTER_HEARTBEAT_S)."""
    return f"{PREFIX}:router:{router_id}:alive"


def route(name: str) -> str:
    """Hash of route `name`'s live state (`switchboard.routes`): its weights, version, last change.

    Operator data, like `api_keys`: it has no expiry; the front doors seed it from the config and
    the admin API (`switchboard routes set`) changes it.
    """
    return f"{PREFIX}:route:{name}"


def routes_version() -> str:
    """A token replaced by every change of any route; front doors poll it, and read the routes when it moved.

    Operator data, like `route`: no expiry."""
    return f"{PREFIX}:routes:version"


def pipelines() -> str:
    """Hash of the pipelines set through the admin API (`router.routing.pipelines.pipeline_table`): name →
    the pipeline's definition (`switchboard.config.pipelines.PipelineConfig`) as msgspec JSON. A
    name the config also has is that pipeline's new definition; the others are pipelines the admin
    API created.

    Operator data, like `route`: no expiry; `switchboard pipelines set|delete` changes it."""
    return f"{PREFIX}:pipelines"


def pipelines_version() -> str:
    """A token replaced by every change of `pipelines`; front doors poll it, and read the pipelines
    again when it moved.

    Operator data, like `pipelines`: no expiry."""
    return f"{PREFIX}:pipelines:version"


def adapters() -> str:
    """Hash of the LoRA adapters registered at run time (`switchboard.adapter_registry`): name → the
    adapter's `[[models]]` entry (`switchboard.config.ModelConfig`) as msgspec JSON.

    Operator data, like `pipelines`: no expiry; `switchboard adapters add|rm` changes it."""
    return f"{PREFIX}:adapters"


def adapters_version() -> str:
    """A token replaced by every change of `adapters`; front doors and workers poll it, and read the
    adapters again when it moved.

    Operator data, like `adapters`: no expiry."""
    return f"{PREFIX}:adapters:version"


# A rollout's observation windows outlive their last write by this long: a judge reads a window
# within seconds; a day leaves them for an operator's look afterwards.
ROLLOUT_WINDOW_TTL_S = 24 * 3600


def rollout_lease(route_name: str) -> str:
    """The front door judging route `route_name`'s rollout (`router.routing.rollouts.judge`): its id, with
    an expiry a few seconds ahead that the holder renews. Tagged by the route's name."""
    return f"{PREFIX}:route:{{{route_name}}}:judge"


def rollout_window(route_name: str, rollout_id: str, window: int) -> str:
    """Hash of what every front door counted for a rollout's targets in one window
    (`router.telemetry.rollout_observations`): `<model>:<counter>` → count. Expires ROLLOUT_WINDOW_TTL_S
    after its last write. Tagged by the route's name."""
    return f"{PREFIX}:route:{{{route_name}}}:rollout:{rollout_id}:{window}"


# Pairs of answers kept per route for offline comparison (`shadow_answers`): at most about this many,
# and for this long after the last one.
SHADOW_ANSWERS_MAXLEN = 1000
SHADOW_ANSWERS_TTL_S = 7 * 24 * 3600


def shadow_answers(route: str) -> str:
    """Stream of a route's compared pairs, the served answer beside its shadow copy's
    (`router.routing.rollouts.shadow`, with `keep_answers`); capped at about SHADOW_ANSWERS_MAXLEN entries."""
    return f"{PREFIX}:shadow:{{{route}}}:answers"


def file_record(file_id: str) -> str:
    """Hash of an uploaded file's record (`router.files.records`): its owner's identity, purpose,
    name, size, times. Deleted with the file, or at its expiry by the sweep."""
    return f"{PREFIX}:file:{file_id}"


def files_of(owner: str) -> str:
    """Sorted set of the ids of the files one key uploaded (its identity, `Caller.owner`), scored by
    upload time: what `GET /v1/files` lists to that key, and to no other."""
    return f"{PREFIX}:files:owner:{owner}"


def files_expiring() -> str:
    """Sorted set of every file id, scored by its expiry (unix seconds): the sweep deletes those due."""
    return f"{PREFIX}:files:expiring"


def batch_record(batch_id: str) -> str:
    """A batch's record (`router.batches.records`, msgpack): its owner, input file, status, times,
    counts and output files. Expires a while after the batch ends (`BATCH_KEPT_S`)."""
    return f"{PREFIX}:batch:{batch_id}"


def batches_of(owner: str) -> str:
    """Sorted set of the ids of the batches one key created, scored by creation time."""
    return f"{PREFIX}:batches:owner:{owner}"


def batches_active() -> str:
    """Sorted set of the batches not yet ended (validating, in progress, cancelling, finalizing), by
    creation time: what the batch runner works through."""
    return f"{PREFIX}:batches:active"


def batch_results(batch_id: str) -> str:
    """Hash of a batch's finished lines: custom_id → its output or error line (msgpack). What makes a
    batch's progress durable: a runner that takes over runs only the lines not in it."""
    return f"{PREFIX}:batch:{batch_id}:results"


def batch_counts(batch_id: str) -> str:
    """Hash of a running batch's finished lines by outcome (`completed`, `failed`): what its
    `request_counts` say while it runs."""
    return f"{PREFIX}:batch:{batch_id}:counts"


def batch_runner_lease() -> str:
    """The front door that runs batches now: its id, with a short expiry it renews while it runs."""
    return f"{PREFIX}:batches:runner"


# A batch's record and results are kept this long after it ends (its files live as files do).
BATCH_KEPT_S = 30 * 24 * 3600
