"""The structs that cross Redis between the front door and the workers, and their codecs.

OpenAI's shapes stay at the edge (`router/openai/`); what travels through Redis is this smaller,
product-owned schema. Both sides import it; nothing else crosses between them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# Failures travel as Chunk.error, never as a finish reason.
FinishReason = Literal["stop", "length", "abort"]


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A function call the assistant made earlier in the conversation."""

    id: str
    name: str
    # The arguments as the model wrote them (JSON text).
    arguments: str


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of a conversation, its content already flattened to text by the front door."""

    role: str
    content: str | None = None
    # A message that sends images: its content in order, a text part as its text and an image as its
    # index in the job's `images` (`content` then holds the text parts joined). Empty: text only.
    parts: tuple[str | int, ...] = ()
    name: str | None = None
    # An assistant's earlier calls, and the call a tool message answers.
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


class StructuredOutput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A constraint on the text generated (at most one kind is set)."""

    json_object: bool = False
    # The JSON Schema as JSON text (schemas are arbitrary JSON; text crosses every hop as it is).
    json_schema: str | None = None
    # vLLM's own constraints: a regular expression, one of several strings, or an EBNF grammar.
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How to sample; None means the engine's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Choices generated per prompt.
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    # Token id → bias added to its logit (-100 bans it, +100 all but forces it).
    logit_bias: dict[int, float] | None = None
    # Log probabilities of each generated token and of this many most likely alternatives; None:
    # no log probabilities at all.
    logprobs: int | None = None
    # Completions: the prompt is repeated before each choice's text.
    echo: bool = False
    structured: StructuredOutput | None = None


class TopLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One of the most likely tokens at a position, and its log probability."""

    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """A generated token, its log probability and the most likely alternatives at its position.

    An echoed prompt's first token has no log probability (None).
    """

    token: str
    logprob: float | None
    top: tuple[TopLogprob, ...] = ()


class ImageInput(msgspec.Struct, frozen=True, kw_only=True):
    """An image a chat job sends, as the front door checked it (`router.intake.images`): its encoded
    bytes (PNG, JPEG, WebP or GIF), their media type, and its size in pixels."""

    media_type: str
    data: bytes
    width: int
    height: int


# A prompt of a plain completion: text, or token ids given by the client.
Prompt = str | tuple[int, ...]


class PoolingTask(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a pooling job computes: one row per input, each its own input's whatever batch it rides in.

    "embed": an embedding per input; "classify": a classifier's probabilities per label, per input;
    "score": a cross-encoder's relevance of each input (a document) to `query`.
    """

    task: Literal["embed", "classify", "score"]
    # Texts, or token ids given by the client; for "score", the documents.
    inputs: tuple[Prompt, ...]
    query: str | None = None
    # "embed": keep the first so many dimensions and renormalize (models with matryoshka_dimensions).
    dimensions: int | None = None
    # vLLM's `truncate_prompt_tokens`: keep only the last so many tokens of each input (-1: as many
    # as the model takes). None: an input past the model's context is the client's error.
    truncate_prompt_tokens: int | None = None
    # "embed": scale each vector to unit length (as OpenAI's embeddings are).
    normalize: bool = True


# The lines a model's jobs wait in, first served first: each is a stream of its own
# (`keys.job_stream`). A request's `service_tier` picks one of the first three; the Batch API's lines
# wait in the last.
Tier = Literal["priority", "default", "flex", "batch"]
TIERS: tuple[Tier, ...] = ("priority", "default", "flex", "batch")
# The tiers a waiting job makes its model wanted by: batch lines alone neither load a model nor keep
# it warm (`router.batches.deadlines` moves them up when their batch's window would not hold).
INTERACTIVE_TIERS: tuple[Tier, ...] = ("priority", "default", "flex")


class Job(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One request waiting on its model's job stream.

    Exactly one of `messages` (chat), `prompts` (plain completion) and `pooling` is set. A completion of several
    prompts is one job: choice `i * n + j` is the `j`th choice of prompt `i`, as OpenAI numbers them.
    """

    id: str
    model: str
    sampling: SamplingParams
    messages: tuple[ChatMessage, ...] | None = None
    # Chat: the tools offered to the model, as OpenAI's `tools` list in JSON text, for the template.
    tools: str | None = None
    # Chat: the model may call tools in its own syntax, which the worker parses into tool calls.
    parse_tool_calls: bool = False
    # Chat: the images the messages' `parts` name by index, in the order the client sent them. They
    # travel with the job, so that a worker that takes it over after another died has them too.
    images: tuple[ImageInput, ...] = ()
    prompts: tuple[Prompt, ...] | None = None
    # An embedder's, classifier's or reranker's job (`sampling` is then empty and unused).
    pooling: PoolingTask | None = None
    created: float
    # Unix time after which nobody waits for the result: a worker drops the job unstarted.
    deadline: float
    tenant: str | None = None
    # W3C trace context (traceparent, tracestate) of the front door's span.
    trace: dict[str, str] | None = None
    # The front door waiting for the result; its heartbeat is `keys.router_alive(router_id)`.
    router_id: str | None = None
    # The route the request named, when `model` is one of its targets (`switchboard.routes`).
    route: str | None = None
    # A copy of a routed request sent to the route's shadow version (`router.routing.rollouts.shadow`):
    # nobody waits for it, so a worker runs it only with slots to spare (`workers.jobs.consume`).
    shadow: bool = False
    # Mixed into the engine's prefix-cache block hashes: one per API key (and the client's own
    # suffix, if it gave one), so that one key can never time another's prompts through the cache
    # (`router.intake.job.cache_salt`); None, one shared cache (keys off).
    cache_salt: str | None = None
    # Which line it waits in among its model's jobs (`TIERS`, first served first): `service_tier`'s
    # priority, default and flex, and the batch tier of the Batch API's lines, which a worker runs
    # only in slots no other job wants (`workers.jobs.consume`).
    tier: Tier = "default"


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts reported by the engine for a finished job."""

    prompt_tokens: int
    completion_tokens: int


class JobError(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why a job failed; `code` maps to an HTTP status at the front door."""

    # "shadow_dropped": a shadow copy a busy worker did not run; only shadow copies get it.
    code: Literal["invalid_request", "timeout", "engine_error", "load_failed", "shadow_dropped"]
    message: str
    # For the client's mistakes: the request parameter at fault, and OpenAI's code for the mistake
    # (for example "context_length_exceeded").
    param: str | None = None
    client_code: str | None = None
    # For failures that pass (a model that failed to load is retried later): when to try again.
    retry_after_s: float | None = None


class Chunk(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A piece of one choice of one job's output, as appended to its result stream.

    Tokens of a choice that arrived together travel together in `text` (and `logprobs`). A choice's
    last chunk carries its `finish_reason`; the job's last chunk also carries the `usage` of all its
    choices, or is an `error`.
    """

    text: str = ""
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    # Calls parsed from the model's text (jobs with `parse_tool_calls`), sent once the choice ends.
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: JobError | None = None
    # On a job's first chunk: the job waited for its model to load (or wake), so its time to first
    # token holds a cold start (`router.telemetry.rollout_observations` counts it apart).
    cold_start: bool = False
    # A pooling job's answer, in one last chunk with its usage: a row per input, in input order,
    # each little-endian float32 values (an embedding; a classifier's probability per label; a
    # reranker's one score). A classifier names its labels, in the order of each row's values.
    pooled: tuple[bytes, ...] = ()
    labels: tuple[str, ...] = ()

    @property
    def is_last(self) -> bool:
        """Whether nothing follows this chunk on the job's result stream."""
        return self.usage is not None or self.error is not None


SlotState = Literal["cold", "loading", "warm", "sleeping", "unloading"]


class DownloadStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A remote model's files being fetched into a worker's node cache (by this worker, or by another
    process on its node whose fetch it waits for)."""

    bytes_done: int
    bytes_total: int
    rate_bps: float = 0.0
    # Seconds left at the current rate; None while no rate is known.
    eta_s: float | None = None


class SlotStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One model on one worker, as its heartbeat advertises it (times are unix seconds)."""

    model: str
    state: SlotState
    # The replica number whose lease this worker holds for the model, while it holds one.
    replica: int | None = None
    in_flight: int = 0
    # When the current load (or wake) began, and how long it is expected to take (measured).
    load_started: float | None = None
    expected_load_s: float | None = None
    # When it last became warm, and when its last job ended (or it became warm, if later).
    warm_since: float | None = None
    idle_since: float | None = None
    # When keep-alive will move it down the ladder (warm → sleeping → cold); None: not while busy,
    # or never.
    leaves_at: float | None = None
    memory_bytes: int = 0
    # Jobs finished per second while it had work: what the queue drains at on this worker.
    jobs_per_s: float = 0.0
    # Jobs on its stream that no worker has taken yet, as this worker last read them (its running
    # jobs are `in_flight`): with fair shares, what waits beyond the model's share of the slots.
    waiting: int = 0
    # While its load fetches the model's files into the node cache first.
    download: DownloadStatus | None = None


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """How a worker advertises itself in Redis (refreshed by its heartbeat)."""

    id: str
    host: str
    pid: int
    started: float
    heartbeat: float
    # Models warm on this worker (what it takes jobs for).
    models: tuple[str, ...]
    triton_http_port: int
    triton_grpc_port: int
    triton_metrics_port: int
    # The worker's own metrics port (`worker.metrics_port`; 0: none yet).
    metrics_port: int = 0
    # The machine kind load times are measured per ("cpu", or the GPU's name).
    kind: str = "cpu"
    # Models this worker may hold; empty: every configured model.
    allowed: tuple[str, ...] = ()
    max_loaded_models: int = 1
    memory_budget_bytes: int = 0
    memory_used_bytes: int = 0
    # Every model that is not cold here.
    slots: tuple[SlotStatus, ...] = ()
    # Triton runs and the engines' runtime is imported (vLLM's pre-imported process started), so a
    # first load here pays for neither. Records of workers that do not say count as ready.
    engines_ready: bool = True
    # The node cache this worker fetches remote models' files into (every worker of one host shares
    # one), and the remote models whose files it holds complete: a load of one of them here skips
    # the download.
    node: str = ""
    cached: tuple[str, ...] = ()


class LoadFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A model whose last load failed: requests get this reason until `retry_at` (unix seconds)."""

    model: str
    worker_id: str
    reason: str
    failed_at: float
    retry_at: float
    failures_in_a_row: int = 1
    # For operators (`/admin/models`), never for clients: what failed, where the worker can say it in
    # words that name nothing but the model's own location (a fetch of its files from its store).
    detail: str = ""


class ModelLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a loaded model accepts, published so that the front door refuses the impossible early."""

    # Prompt and completion tokens together.
    max_model_len: int
    vocab_size: int
    # No token stands for more characters than this: a prompt longer than max_model_len times this
    # cannot fit, whatever the tokenizer makes of it.
    max_token_chars: int
    # An embedder's vector size: `dimensions` above it cannot be answered (None: not an embedder, or
    # a worker from before it was published).
    embedding_size: int | None = None
    # A model that takes images: the fewest prompt tokens one image becomes (by its processor's
    # rule), so that the front door counts at least that many per image (None: text only).
    min_image_tokens: int | None = None


class DesiredState(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's request to load or unload a model (`POST /admin/models/{name}/load|unload`), or
    to fetch a remote model's files into every node cache without loading it (`.../prefetch`)."""

    action: Literal["load", "unload", "prefetch"]
    # Unix time of the request: an unload applies to replicas whose load began before it.
    at: float


# One encoder and one decoder per type, built once per process (msgspec's fast path).
_encoder = msgspec.msgpack.Encoder()
job_decoder = msgspec.msgpack.Decoder(Job)
chunk_decoder = msgspec.msgpack.Decoder(Chunk)
worker_decoder = msgspec.msgpack.Decoder(WorkerRecord)
load_failure_decoder = msgspec.msgpack.Decoder(LoadFailure)
desired_state_decoder = msgspec.msgpack.Decoder(DesiredState)
model_limits_decoder = msgspec.msgpack.Decoder(ModelLimits)


def encode(value: Job | Chunk | WorkerRecord | LoadFailure | DesiredState | ModelLimits) -> bytes:
    """Serialize a wire struct to msgpack."""
    return _encoder.encode(value)
