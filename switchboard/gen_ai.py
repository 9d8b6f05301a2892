"""OpenTelemetry GenAI semantic-convention attributes of a job, shared by both sides' spans."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from switchboard.wire import Job, Usage

OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
# Switchboard's own, beside the convention's.
JOB_ID = "switchboard.job.id"
WORKER_ID = "switchboard.worker.id"
COLD = "switchboard.cold_start"
TENANT = "switchboard.tenant"


# The GenAI operation of each pooling task ("embeddings" is the convention's; the other two, ours).
POOLING_OPERATIONS = {"embed": "embeddings", "classify": "classify", "score": "rerank"}


def operation(job: Job) -> str:
    """The GenAI operation a job is: "chat", "text_completion" for a plain completion, or a pooling
    job's ("embeddings", "classify", "rerank")."""
    if job.pooling is not None:
        return POOLING_OPERATIONS[job.pooling.task]
    return "chat" if job.messages is not None else "text_completion"


def span_name(job: Job) -> str:
    """The convention's span name: `{operation} {model}`."""
    return f"{operation(job)} {job.model}"


def job_attributes(job: Job) -> dict[str, Any]:
    """The request's attributes: operation, model and the sampling parameters that were set."""
    sampling = job.sampling
    attributes: dict[str, Any] = {
        OPERATION: operation(job),
        REQUEST_MODEL: job.model,
        JOB_ID: job.id,
        "gen_ai.request.choice.count": sampling.n,
    }
    optional = {
        "gen_ai.request.max_tokens": sampling.max_tokens,
        "gen_ai.request.temperature": sampling.temperature,
        "gen_ai.request.top_p": sampling.top_p,
        "gen_ai.request.top_k": sampling.top_k,
        "gen_ai.request.seed": sampling.seed,
        "gen_ai.request.presence_penalty": sampling.presence_penalty,
        "gen_ai.request.frequency_penalty": sampling.frequency_penalty,
        "gen_ai.request.stop_sequences": list(sampling.stop) or None,
        TENANT: job.tenant,
    }
    attributes.update((name, value) for name, value in optional.items() if value is not None)
    return attributes


def response_attributes(model: str, usage: Usage | None, finish_reasons: Iterable[str]) -> dict[str, Any]:
    """What the answer was: the model that produced it, its token counts, its finish reasons."""
    attributes: dict[str, Any] = {RESPONSE_MODEL: model, FINISH_REASONS: list(finish_reasons)}
    if usage is not None:
        attributes[INPUT_TOKENS] = usage.prompt_tokens
        attributes[OUTPUT_TOKENS] = usage.completion_tokens
    return attributes
