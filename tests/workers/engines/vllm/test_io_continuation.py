"""vLLM's parameters and outputs for a continued request (the demo tokenizer; vLLM imported, not run)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from switchboard.wire import SamplingParams
from workers.engines.base import EngineRequest
from workers.engines.prompts import PromptBuilder

pytest.importorskip("vllm")


def test_a_continued_request_generates_only_what_is_left_and_counts_every_token(
    builder: PromptBuilder, tokenizer: Any
) -> None:
    from workers.engines.vllm.io import OutputReader, vllm_sampling_params

    sampling = SamplingParams(max_tokens=8, min_tokens=4)
    prompt = builder.build(
        EngineRequest(request_id="r", sampling=sampling, prompt="the cat", continuation=" sat on")
    )
    done = prompt.continuation_tokens
    params = vllm_sampling_params(sampling, prompt, builder, prompt_param="prompt")
    assert params.max_tokens == 8 - done and params.min_tokens == max(0, 4 - done)
    completion = SimpleNamespace(index=0, text=" the", token_ids=[7], finish_reason="length", logprobs=None)
    (delta,) = OutputReader(sampling, prompt, tokenizer).deltas(
        SimpleNamespace(outputs=[completion], finished=True)
    )
    assert delta.text == " the" and delta.last
    assert delta.prompt_tokens == prompt.prompt_tokens
    assert delta.completion_tokens == done + 1
