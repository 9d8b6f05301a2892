"""Our sampling parameters into vLLM's, and vLLM's request outputs into deltas.

Kept apart from the engine's lifecycle (`engine.py`): this is the part that follows OpenAI's request
surface, and it changes when that surface grows.
"""

from __future__ import annotations

import math
import re
from typing import Any

from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from switchboard.wire import FinishReason, SamplingParams, TokenLogprob, TopLogprob
from workers.engines.base import Delta, InvalidEngineRequest
from workers.engines.prompts import BuiltPrompt, PromptBuilder
from workers.engines.refusals import client_error
from workers.engines.sampling import (
    LOWEST_LOGPROB,
    check_logit_bias,
    completion_budget,
    finite_logprob,
    greedy_copies,
    remaining_min_tokens,
)
from workers.engines.vllm.images import decoded_images

__all__ = [
    "LOWEST_LOGPROB",
    "OutputReader",
    "engine_prompt",
    "finish_reason",
    "greedy_copies",
    "refusal_of",
    "vllm_sampling_params",
]


# vLLM's refusal of a prompt whose images expanded it past the context (its InputProcessor's words).
_EXPANDED_TOO_LONG = re.compile(r"prompt \(length (\d+)\) is longer than the maximum model length of (\d+)")


def engine_prompt(prompt: BuiltPrompt, cache_salt: str | None) -> Any:
    """vLLM's prompt for one request: its tokens, its images decoded, and its prefix-cache salt if it
    has one (vLLM mixes it into the first block's hash, so only requests with the same salt share
    cached prefixes). Decoding images takes a while: call it off the event loop for a prompt with some.

    vLLM's processor finds each image's placeholder among the token ids and expands it into the
    image's tokens, as it does for a text prompt (and hashes the images into the prefix cache's keys).
    """
    from vllm.inputs import TokensPrompt

    inputs = TokensPrompt(prompt_token_ids=prompt.token_ids)
    if prompt.images:
        inputs["multi_modal_data"] = {"image": decoded_images(prompt.images)}
    if cache_salt is not None:
        inputs["cache_salt"] = cache_salt
    return inputs


def vllm_sampling_params(
    sampling: SamplingParams,
    prompt: BuiltPrompt,
    builder: PromptBuilder,
    *,
    prompt_param: str,
    skip_special_tokens: bool = True,
    output_every: int = 1,
) -> Any:
    """vLLM's SamplingParams for one request whose prompt is `prompt`, handing its output over every
    `output_every` tokens (vLLM's stream interval; the first and the last token never wait)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.sampling_params import SamplingParams as VllmSamplingParams

    max_tokens = completion_budget(sampling, prompt, builder, prompt_param)
    min_tokens = remaining_min_tokens(sampling, prompt)
    check_logit_bias(sampling.logit_bias, builder.limits.vocab_size)
    optional: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "seed": sampling.seed,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "repetition_penalty": sampling.repetition_penalty,
        "min_tokens": min_tokens,
        "logit_bias": sampling.logit_bias,
        "logprobs": sampling.logprobs,
        # Echoed prompts report their own tokens' log probabilities too, as OpenAI's do.
        "prompt_logprobs": sampling.logprobs if sampling.echo else None,
        "stream_interval": output_every if output_every > 1 else None,
    }
    if sampling.structured is not None:
        structured = sampling.structured
        optional["structured_outputs"] = StructuredOutputsParams(
            json=structured.json_schema,
            json_object=structured.json_object or None,
            regex=structured.regex,
            choice=list(structured.choice) if structured.choice is not None else None,
            grammar=structured.grammar,
        )
    try:
        return VllmSamplingParams(
            n=sampling.n // greedy_copies(sampling),
            max_tokens=max_tokens,
            stop=list(sampling.stop) or None,
            skip_special_tokens=skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,
            **{name: value for name, value in optional.items() if value is not None},
        )
    except (ValueError, VLLMValidationError) as exc:
        raise client_error(exc) from exc


class OutputReader:
    """Turns the request outputs of one vLLM request into deltas (its counts, echo and log probs)."""

    def __init__(self, sampling: SamplingParams, prompt: BuiltPrompt, tokenizer: Any) -> None:
        self._sampling = sampling
        self._prompt = prompt
        self._tokenizer = tokenizer
        # A continued request's earlier tokens count as generated.
        self._completion_tokens = prompt.continuation_tokens
        # Until vLLM says (its first output), the prompt's own count: its images at their fewest.
        self._prompt_tokens = prompt.prompt_tokens
        self._copies = greedy_copies(sampling)
        # Choices that still owe the echoed prompt (it goes before their first text).
        self._echo_due = set(range(sampling.n)) if sampling.echo else set()
        self._prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    def deltas(self, output: Any) -> list[Delta]:
        """The deltas of one request output; the last one is marked when the request finished."""
        deltas: list[Delta] = []
        self._prompt_tokens = expanded_prompt_tokens(output, self._prompt)
        for completion in output.outputs:
            if completion.finish_reason == "error":
                raise RuntimeError(f"the engine failed the request (choice {completion.index})")
            self._completion_tokens += len(completion.token_ids) * self._copies
            for copy in range(self._copies):
                deltas.append(self._delta(output, completion, completion.index * self._copies + copy))
        if output.finished:
            if not deltas:
                deltas.append(
                    Delta(
                        text="",
                        prompt_tokens=self._prompt_tokens,
                        completion_tokens=self._completion_tokens,
                    )
                )
            deltas[-1].last = True
        return deltas

    def _delta(self, output: Any, completion: Any, index: int) -> Delta:
        text, logprobs = completion.text, self._logprobs(completion)
        if index in self._echo_due:
            self._echo_due.discard(index)
            text = self._prompt.text + text
            logprobs = self._echoed_logprobs(output) + logprobs
        return Delta(
            text=text,
            index=index,
            logprobs=logprobs,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._completion_tokens,
            finish_reason=finish_reason(completion.finish_reason),
        )

    def _logprobs(self, completion: Any) -> tuple[TokenLogprob, ...]:
        if self._sampling.logprobs is None or completion.logprobs is None:
            return ()
        return tuple(
            self._position(token_id, candidates)
            for token_id, candidates in zip(completion.token_ids, completion.logprobs, strict=False)
        )

    def _echoed_logprobs(self, output: Any) -> tuple[TokenLogprob, ...]:
        """The prompt tokens' log probabilities (the first has none), once per request."""
        if self._sampling.logprobs is None:
            return ()
        if self._prompt_logprobs is None:
            positions = output.prompt_logprobs or [None] * len(self._prompt.token_ids)
            self._prompt_logprobs = tuple(
                self._position(token_id, candidates)
                for token_id, candidates in zip(self._prompt.token_ids, positions, strict=False)
            )
        return self._prompt_logprobs

    def _position(self, token_id: int, candidates: dict[int, Any] | None) -> TokenLogprob:
        top_n = self._sampling.logprobs or 0
        if not candidates:
            return TokenLogprob(token=self._decode(token_id), logprob=None)
        chosen = candidates.get(token_id)
        ranked = sorted(candidates.items(), key=lambda item: item[1].rank or math.inf)[:top_n]
        top = tuple(
            TopLogprob(token=self._token_text(other, entry), logprob=finite_logprob(entry.logprob))
            for other, entry in ranked
        )
        logprob = finite_logprob(chosen.logprob) if chosen is not None else None
        token = self._token_text(token_id, chosen) if chosen is not None else self._decode(token_id)
        return TokenLogprob(token=token, logprob=logprob, top=top)

    def _token_text(self, token_id: int, entry: Any) -> str:
        decoded = entry.decoded_token
        return decoded if decoded is not None else self._decode(token_id)

    def _decode(self, token_id: int) -> str:
        return str(self._tokenizer.decode([token_id]))


def expanded_prompt_tokens(output: Any, prompt: BuiltPrompt) -> int:
    """The prompt's tokens as vLLM counts them: each image's placeholder expanded into the image's
    tokens (the continuation of a continued request is not the prompt's)."""
    ids = getattr(output, "prompt_token_ids", None)
    if ids is None:
        return prompt.prompt_tokens
    return len(ids) - prompt.continuation_tokens


def finish_reason(reason: str | None) -> FinishReason | None:
    """vLLM's finish reason in our words (anything unknown ends the choice as a stop)."""
    if reason is None or reason in ("stop", "length", "abort"):
        return reason  # type: ignore[return-value]
    return "stop"


def refusal_of(
    exc: BaseException, *, before_output: bool, prompt_param: str = "prompt"
) -> InvalidEngineRequest | None:
    """The client's error that `exc`, raised by vLLM's `generate`, stands for; None for an engine failure.

    vLLM validates a request as it is added, before its first output, and marks what is the client's
    fault: its VLLMClientError (an invalid regex, grammar or schema, a schema nested too deeply, ...),
    and the ValueError its checks raise, which `AsyncLLM.generate` passes on as an EngineGenerateError
    caused by it. Anything else, or anything after the first output, is the engine's own failure.
    A prompt that its images expanded past the context is refused as too long (`prompt_param`).
    """
    from vllm.exceptions import VLLMClientError
    from vllm.v1.engine.exceptions import EngineGenerateError

    if isinstance(exc, EngineGenerateError):
        cause = exc.__cause__
        if not before_output or not isinstance(cause, ValueError):
            return None
        return client_error(cause)
    if not isinstance(exc, VLLMClientError):
        return None
    return _expanded_too_long(exc, prompt_param) or client_error(exc)


def _expanded_too_long(exc: BaseException, prompt_param: str) -> InvalidEngineRequest | None:
    """The context-length refusal of a prompt that vLLM found too long once its images were expanded
    (only vLLM counts an image's tokens): the same code as every other prompt too long."""
    found = _EXPANDED_TOO_LONG.search(str(exc.args[0]) if exc.args else "")
    if found is None:
        return None
    tokens, context = found.groups()
    return InvalidEngineRequest(
        f"This model's maximum context length is {context} tokens, and `{prompt_param}` takes {tokens} "
        f"tokens with its images. Send fewer or smaller images, or shorten `{prompt_param}`.",
        param=prompt_param,
        code=CONTEXT_LENGTH_EXCEEDED,
    )
