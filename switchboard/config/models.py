"""The models Switchboard can serve (`[[models]]`): each one's kind, engine and batching, and the
demo model served when none is configured.

A generator streams text (chat and completions). The pooling kinds answer once, one row per input:
an embedder (`/v1/embeddings`), a classifier (`/classify`) and a reranker, a cross-encoder that
scores each document against a query (`/v1/rerank`). Their throughput depends on batching, so the
worker's Triton model for one of them declares Triton's dynamic batcher (`BatchingConfig`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from switchboard.config.names import ModelName

ModelKind = Literal["generate", "embed", "classify", "score"]
POOLING_KINDS: tuple[ModelKind, ...] = ("embed", "classify", "score")

EngineName = Literal["vllm", "trtllm", "torch"]
# The engine a model runs on when its entry names none. The pooling kinds run on a plain PyTorch
# runner inside the worker's Triton model (README's embeddings section says why, with figures).
DEFAULT_ENGINE: dict[ModelKind, EngineName] = {
    "generate": "vllm",
    "embed": "torch",
    "classify": "torch",
    "score": "torch",
}
ENGINES_OF_KIND: dict[ModelKind, tuple[EngineName, ...]] = {
    "generate": ("vllm", "trtllm"),
    "embed": ("torch",),
    "classify": ("torch",),
    "score": ("torch",),
}

DEMO_MODEL_NAME = "switchboard-demo"


class BatchingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How Triton's dynamic batcher groups a pooling model's requests into one engine call.

    A request waits at most `queue_delay_ms` for others to join it; a batch that reaches one of
    `preferred_batch_sizes` leaves at once. Rows count, not requests: a job of 10 inputs is 10 rows.
    """

    # false: every request runs alone (Triton's default scheduler), for comparison.
    enabled: bool = True
    max_batch_size: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    preferred_batch_sizes: list[Annotated[int, msgspec.Meta(ge=1)]] = msgspec.field(
        default_factory=lambda: [16, 32, 64]
    )
    # The usual window is 5-20 ms: long enough for a burst to meet, short enough for one request.
    queue_delay_ms: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 5.0
    # Triton instances of the model (batching on or off). Each hands its batch to the model's one
    # process, which computes one batch at a time: with two, the next batch is gathered, handed
    # over and waiting while one computes, and the answers of one go back while the next computes.
    instances: Annotated[int, msgspec.Meta(ge=1, le=8)] = 2


class StorageConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where a remote model's store is and whose credentials read it, beyond what the environment says.

    An `s3://` path is read the way AWS's SDK reads any bucket: the endpoint, region and credentials
    of the environment (`AWS_ENDPOINT_URL`, `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`...), the shared files
    (`~/.aws/config`, `~/.aws/credentials`), or an instance's or pod's role. An `hf://` path is read
    through `huggingface_hub` (`HF_TOKEN`, `HF_ENDPOINT` for a mirror).
    """

    # The store's URL: an S3-compatible service (MinIO, R2, Ceph...), or a Hub mirror for `hf://`.
    endpoint_url: str | None = None
    # The bucket's region (`s3://` only).
    region: str | None = None
    # A named profile of the shared AWS files, for `s3://`: its credentials, region and endpoint.
    profile: str | None = None


class LoraConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a generator serves LoRA adapters of itself (`[[models]]` entries with `base` = its name).

    A base named by an adapter gets these defaults without a table of its own; one that only
    takes adapters registered at run time (`switchboard adapters add`) needs the table.
    """

    # The largest rank of an adapter the engine takes (vLLM: `max_lora_rank`; 8, 16, 32, 64...).
    max_rank: Annotated[int, msgspec.Meta(ge=1, le=512)] = 16
    # Adapters held by one replica of the base at once (vLLM's CPU-side adapter cache,
    # `max_cpu_loras`): the controller loads and evicts within it, so the engine never evicts.
    max_adapters: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    # Different adapters in one engine batch (vLLM: `max_loras`; each costs a slot of GPU memory).
    max_adapters_per_batch: Annotated[int, msgspec.Meta(ge=1, le=256)] = 8


class ModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One model that Switchboard can serve."""

    name: ModelName
    # A LoRA adapter of the generator named here: `path` holds the adapter (a PEFT folder:
    # `adapter_config.json` and its weights), which is loaded onto a warm replica of its base.
    base: ModelName | None = None
    # Where the model's files are: a local folder, `s3://bucket/prefix` (any S3-compatible store), or
    # `hf://org/name` with an optional `@revision` (the Hugging Face Hub). A remote model's files are
    # fetched into the worker's node cache (`worker.model_cache_dir`) before its first load there.
    path: str
    # A remote path's store, where the environment does not say it all.
    storage: StorageConfig | None = None
    # A generator (chat and completions), or a pooling model: an embedder, a classifier or a
    # reranker that scores documents against a query.
    kind: ModelKind = "generate"
    # None: the kind's engine (vLLM for generators, the PyTorch runner for the pooling kinds).
    engine: EngineName | None = None
    # Passed to the engine as they are (for vLLM: AsyncEngineArgs fields; for TensorRT-LLM: the
    # LLM's TorchLlmArgs fields, over Switchboard's defaults: see workers/engines/trtllm/load_plan.py).
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)
    # Seconds the model stays warm with nothing to do: 0 leaves as soon as it is idle, -1 never.
    keep_alive_s: Annotated[float, msgspec.Meta(ge=-1)] = 300.0
    # Where the engine can sleep (vLLM sleep mode, GPUs only), an idle model sleeps first and
    # leaves only after this many more seconds asleep; -1 keeps it asleep.
    asleep_keep_alive_s: Annotated[float, msgspec.Meta(ge=-1)] = 1800.0
    # Replicas kept however idle the model is (0 = scale to zero) and at most (None = no limit).
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] = 0
    max_replicas: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Load one replica when the worker starts instead of on the first request.
    preload: bool = False
    # Memory the loaded model takes (GiB); measured after the first load when not declared.
    footprint_gib: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # vLLM's parser for the model's own tool-call syntax ("hermes", "llama3_json", "mistral",
    # "pythonic", ...): with one, `tool_choice: "auto"` lets the model decide to call tools. The
    # TensorRT-LLM engine parses no tool calls: a trtllm model with a parser fails to load.
    tool_call_parser: str | None = None
    # Compile the engine's structured-output backend while the model loads (beside Triton's own
    # binding), so that its first constrained answer takes milliseconds rather than seconds. On for
    # every model a pipeline uses as its router (a router answers with a constrained label only).
    warm_structured_output: bool = False
    # How a worker shares its job slots (`worker.max_concurrent_jobs`) among the models warm on it
    # (see workers/jobs/shares.py). Each warm model always has a slot for a job that arrives; the
    # other slots, while scarce, go to the models with jobs waiting: the higher priority first, and
    # among equal priorities in proportion to weight. The defaults make all models equal.
    priority: int = 0
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Pooling kinds: how Triton's dynamic batcher groups their requests.
    batching: BatchingConfig = msgspec.field(default_factory=BatchingConfig)
    # Embedders trained to be cut short (Matryoshka): the sizes a request's `dimensions` may ask
    # for, or [] for any size up to the model's. None: the model's vectors are whole only.
    matryoshka_dimensions: list[Annotated[int, msgspec.Meta(ge=1)]] | None = None
    # A base's settings for its adapters; None for a model no adapter names.
    lora: LoraConfig | None = None
    # Whether the model takes images (`image_url` parts). None: as its files say (a `vision_config`
    # in its config.json, read at the front door for a local folder and by the worker that loads it);
    # false refuses images to a vision-language model; an adapter takes what its base takes.
    images: bool | None = None

    @property
    def adapter(self) -> bool:
        """Whether this is a LoRA adapter served on its base's engine."""
        return self.base is not None

    @property
    def engine_name(self) -> EngineName:
        """The engine the model runs on: the one its entry names, or its kind's."""
        return self.engine or DEFAULT_ENGINE[self.kind]

    @property
    def pooling(self) -> bool:
        """Whether the model answers once per input (embed, classify, score) rather than streaming text."""
        return self.kind in POOLING_KINDS


def demo_model(demo_model_dir: str) -> ModelConfig:
    """The model served when none is configured: a tiny one built locally on first run, in
    `demo_model_dir` (`worker.demo_model_dir`)."""
    path = str(Path(demo_model_dir).expanduser())
    engine_args = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True}
    return ModelConfig(name=DEMO_MODEL_NAME, path=path, engine_args=engine_args)


def triton_model_name(model: str) -> str:
    """The model's name inside a worker's Triton: only letters, digits, '.', '_' and '-' are allowed."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", model)
