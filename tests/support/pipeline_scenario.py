"""Front-door scenarios of router-model and cascade pipelines: the models, the settings, and the
scripted answers (a router's label with its log-probabilities, a draft confident or not)."""

from __future__ import annotations

import json
from typing import Any

from switchboard.config import (
    CascadeConfig,
    ModelConfig,
    PipelineConfig,
    RouterModelConfig,
    RouterTarget,
    Settings,
)
from switchboard.wire import Chunk, TokenLogprob, TopLogprob, Usage
from tests.support.front_door_harness import settings_for

ROUTER, CODER, GENERAL, DRAFT, STRONG = "router", "coder", "general", "draft", "strong"
MODELS = (ROUTER, CODER, GENERAL, DRAFT, STRONG)
ROUTED, CASCADE = "smart", "thrifty"
USED = Usage(prompt_tokens=10, completion_tokens=2)


def settings(
    redis_url: str, *, timeout_s: float = 2.0, warm_margin: float = 0.1, hold_s: float = 5.0
) -> Settings:
    configured = settings_for(redis_url, models=[ModelConfig(name=m, path="/nonexistent") for m in MODELS])
    targets = {
        "code": RouterTarget(model=CODER, description="programming questions"),
        "chat": RouterTarget(model=GENERAL, description="everything else"),
    }
    router = RouterModelConfig(
        model=ROUTER, targets=targets, default="chat", timeout_s=timeout_s, warm_margin=warm_margin
    )
    cascade = CascadeConfig(draft=DRAFT, strong=STRONG, min_mean_logprob=-1.0, hold_s=hold_s)
    configured.pipelines = {ROUTED: PipelineConfig(router=router), CASCADE: PipelineConfig(cascade=cascade)}
    return configured


def router_says(label: str, other: str, logprob: float, other_logprob: float) -> list[Chunk]:
    """The router's answer `label`, having weighed `other` too."""
    top = (TopLogprob(label, logprob), TopLogprob(other, other_logprob))
    return [
        Chunk(text=label, logprobs=(TokenLogprob(label, logprob, top),), finish_reason="stop", usage=USED)
    ]


def drafted(text: str, logprob: float, finish_reason: str = "stop") -> list[Chunk]:
    """A draft of one chunk per word, each token `logprob` likely."""
    words = text.split(" ")
    chunks = [
        Chunk(
            text=word if i == 0 else f" {word}",
            logprobs=(TokenLogprob(word, logprob, (TopLogprob(word, logprob),)),),
        )
        for i, word in enumerate(words)
    ]
    return [
        *chunks,
        Chunk(finish_reason=finish_reason, usage=Usage(prompt_tokens=10, completion_tokens=len(words))),
    ]  # type: ignore[arg-type]


def answered_by_name(model: str) -> list[Chunk]:
    return [Chunk(text=f"{model} answers", finish_reason="stop", usage=USED)]


def body(model: str, stream: bool = False, **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Fix my loop"}],
        "stream": stream,
        **fields,
    }


def events_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
