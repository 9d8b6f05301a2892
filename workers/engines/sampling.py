"""The rules of OpenAI's sampling surface that every engine applies the same way.

How many tokens a request may generate, what greedy means, which logit biases a vocabulary
accepts, and how an impossible log probability travels. Each engine's own module (`vllm.io`,
`trtllm.io`) maps the result onto its engine's parameters.
"""

from __future__ import annotations

import math

from switchboard.wire import SamplingParams
from workers.engines.base import InvalidEngineRequest
from workers.engines.prompts import BuiltPrompt, PromptBuilder

# JSON has no -inf; OpenAI and vLLM's server send this for a token of probability zero.
LOWEST_LOGPROB = -9999.0
# Below this temperature sampling is greedy (vLLM's own threshold; TensorRT-LLM's is 0).
GREEDY_BELOW = 1e-5


def is_greedy(sampling: SamplingParams) -> bool:
    """Whether the request asks for greedy decoding (a temperature of about 0)."""
    return sampling.temperature is not None and sampling.temperature < GREEDY_BELOW


def greedy_copies(sampling: SamplingParams) -> int:
    """How many identical copies each generated choice stands for.

    Greedy choices are all the same, and the engines refuse to generate several of them; OpenAI
    answers `n` > 1 at temperature 0 all the same, so one is generated and repeated.
    """
    return sampling.n if is_greedy(sampling) else 1


def completion_budget(
    sampling: SamplingParams, prompt: BuiltPrompt, builder: PromptBuilder, prompt_param: str
) -> int:
    """The tokens the engine may still generate for this request.

    Without `max_tokens`, the rest of the context. With it, refused if it does not fit after the
    prompt (as OpenAI and vLLM do); a continued request has generated part of its allowance
    already (at least one is left: the worker that died would have sent the last chunk otherwise).
    """
    if sampling.max_tokens is None:
        return builder.limits.max_model_len - len(prompt.token_ids)
    if sampling.max_tokens < 1:
        raise InvalidEngineRequest(
            f"max_tokens must be at least 1, got {sampling.max_tokens}.",
            param="max_tokens",
            code="invalid_value",
        )
    builder.refuse_completion_too_long(prompt.prompt_tokens, sampling.max_tokens, prompt_param)
    return max(1, sampling.max_tokens - prompt.continuation_tokens)


def remaining_min_tokens(sampling: SamplingParams, prompt: BuiltPrompt) -> int | None:
    """`min_tokens` less what a continued request has generated already."""
    if sampling.min_tokens is None:
        return None
    return max(0, sampling.min_tokens - prompt.continuation_tokens)


def check_logit_bias(logit_bias: dict[int, float] | None, vocab_size: int) -> None:
    """Refuse biases on token ids the model's vocabulary does not have."""
    if not logit_bias:
        return
    outside = sorted(token for token in logit_bias if not 0 <= token < vocab_size)
    if outside:
        raise InvalidEngineRequest(
            f"logit_bias names token ids outside the model's vocabulary (0 to {vocab_size - 1}): "
            f"{outside[:5]}.",
            param="logit_bias",
            code="invalid_value",
        )


def finite_logprob(logprob: float) -> float:
    """A log probability JSON can carry: -inf and NaN become LOWEST_LOGPROB."""
    return max(logprob, LOWEST_LOGPROB) if not math.isnan(logprob) else LOWEST_LOGPROB
