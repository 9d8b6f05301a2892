"""Our sampling parameters into TensorRT-LLM's, and its streamed request outputs into deltas.

Pure: it never imports `tensorrt_llm`. `trtllm_sampling` returns plain keyword arguments for
`tensorrt_llm.SamplingParams` (the engine turns the guide and the logit bias into TensorRT-LLM's
objects); `TrtOutputReader` reads the attributes of TensorRT-LLM's `RequestOutput` and
`CompletionOutput` (1.x), so plain objects stand in for them in tests.

What TensorRT-LLM does differently from vLLM, and how the reader copes:
- One `RequestOutput` is mutated and yielded again on every step; each choice's `token_ids`,
  `text` and `logprobs` grow. Its `*_diff` properties go stale for n > 1 (only the choice in the
  current response has its counters moved), so the reader keeps its own per-choice counters.
- A choice's `finish_reason` is set only in the request's final response (or as "cancelled"), and
  for n > 1 a choice that ended earlier may never get one: it is inferred (length or stop).
- Stop strings are found in the detokenized text after it was streamed: the text is cut back at
  the stop string (it shrinks) and the request is aborted. Text already sent is never taken back,
  so the reader holds back the last `len(longest stop) - 1` characters while a choice runs, as
  vLLM does, and looks for the stop strings itself too.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from typing import Any

from switchboard.wire import FinishReason, SamplingParams, TokenLogprob, TopLogprob
from workers.engines.base import Delta, InvalidEngineRequest
from workers.engines.prompts import BuiltPrompt, PromptBuilder
from workers.engines.sampling import (
    check_logit_bias,
    completion_budget,
    finite_logprob,
    greedy_copies,
    is_greedy,
    remaining_min_tokens,
)

# TensorRT-LLM seeds are unsigned 64-bit; a drawn seed stays within 63 bits.
SEED_BITS = 63
# How TensorRT-LLM (1.2, its PR #9078) begins the message with which its executor ends a request whose
# guide its grammar backend (xgrammar) cannot compile, that request alone; the request's stream
# raises it as a RequestError.
GUIDED_DECODING_ERROR = "Guided decoding error"


class TrtSampling:
    """What one request's `tensorrt_llm.SamplingParams` is built from."""

    def __init__(
        self,
        kwargs: dict[str, Any],
        *,
        guide: dict[str, Any] | None = None,
        logit_bias: dict[int, float] | None = None,
    ) -> None:
        # Keyword arguments of SamplingParams, but for the two below.
        self.kwargs = kwargs
        # Keyword arguments of GuidedDecodingParams (one guide), for `guided_decoding`.
        self.guide = guide
        # Token id → bias, for `embedding_bias` (a float32 vector over the vocabulary).
        self.logit_bias = logit_bias

    @property
    def max_tokens(self) -> int:
        """The tokens the engine may generate per choice."""
        return int(self.kwargs["max_tokens"])


def trtllm_sampling(
    sampling: SamplingParams,
    prompt: BuiltPrompt,
    builder: PromptBuilder,
    *,
    prompt_param: str,
    skip_special_tokens: bool = True,
    draw_seed: Any = None,
) -> TrtSampling:
    """TensorRT-LLM's sampling parameters for one request whose prompt is `prompt`.

    `draw_seed`: where an unseeded request's seed comes from (`random.getrandbits` unless given):
    TensorRT-LLM's default seed is a fixed 0, so unseeded identical requests would sample alike.
    """
    check_logit_bias(sampling.logit_bias, builder.limits.vocab_size)
    kwargs: dict[str, Any] = {
        "max_tokens": completion_budget(sampling, prompt, builder, prompt_param),
        # Greedy choices are generated once and copied (TensorRT-LLM refuses several greedy ones).
        "n": sampling.n // greedy_copies(sampling),
        "stop": list(sampling.stop) or None,
        "include_stop_str_in_output": False,
        "skip_special_tokens": skip_special_tokens,
        "min_tokens": remaining_min_tokens(sampling, prompt),
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "repetition_penalty": sampling.repetition_penalty,
        **_decoding(sampling),
        "seed": _seed(sampling.seed, draw_seed),
    }
    if sampling.logprobs is not None:
        # TensorRT-LLM returns nothing for 0: ask for one, report the chosen token's alone.
        kwargs["logprobs"] = max(1, sampling.logprobs)
        if sampling.echo:
            kwargs["prompt_logprobs"] = max(1, sampling.logprobs)
    kwargs = {name: value for name, value in kwargs.items() if value is not None}
    return TrtSampling(kwargs, guide=_guide(sampling), logit_bias=sampling.logit_bias or None)


def _decoding(sampling: SamplingParams) -> dict[str, Any]:
    """Greedy as TensorRT-LLM spells it (top_k 1), or sampling with OpenAI's defaults filled in.

    With no temperature, top_p and top_k at all, TensorRT-LLM decodes greedily; OpenAI samples at
    temperature 1, so the defaults are written out.
    """
    if is_greedy(sampling):
        return {"top_k": 1}
    top_p = 1.0 if sampling.top_p is None else sampling.top_p
    if not 0 < top_p <= 1:
        raise InvalidEngineRequest(
            f"top_p must be above 0 and at most 1, got {top_p}.", param="top_p", code="invalid_value"
        )
    temperature = 1.0 if sampling.temperature is None else sampling.temperature
    if temperature < 0:
        raise InvalidEngineRequest(
            f"temperature must not be negative, got {temperature}.", param="temperature", code="invalid_value"
        )
    top_k = sampling.top_k if sampling.top_k is not None and sampling.top_k > 0 else None  # 0, -1: all
    return {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": sampling.min_p}


def _seed(seed: int | None, draw_seed: Any) -> int:
    if seed is None:
        return int((draw_seed or random.getrandbits)(SEED_BITS))
    return seed % 2**64  # OpenAI's seeds may be negative


def _guide(sampling: SamplingParams) -> dict[str, Any] | None:
    structured = sampling.structured
    if structured is None:
        return None
    if structured.json_schema is not None:
        return {"json": structured.json_schema}
    if structured.json_object:
        return {"json_object": True}
    if structured.regex is not None:
        return {"regex": structured.regex}
    if structured.choice is not None:
        return {"regex": choice_regex(structured.choice)}
    if structured.grammar is not None:
        return {"grammar": structured.grammar}
    return None


def choice_regex(choices: Sequence[str]) -> str:
    """A regular expression that matches exactly one of `choices` (TensorRT-LLM has no choice guide)."""
    return "(" + "|".join(re.escape(choice) for choice in choices) + ")"


def finish_reason(reason: str | None) -> FinishReason | None:
    """TensorRT-LLM's finish reason in our words: cancelled is an abort, a timeout ran out of length."""
    if reason is None or reason in ("stop", "length"):
        return reason  # type: ignore[return-value]
    if reason == "cancelled":
        return "abort"
    if reason == "timeout":
        return "length"
    return "stop"


class _Choice:
    """How far one generated choice has been read."""

    __slots__ = ("done", "logprobs", "text", "tokens")

    def __init__(self) -> None:
        self.tokens = 0  # token ids counted
        self.logprobs = 0  # log probability entries sent
        self.text = 0  # characters of text sent
        self.done = False


class TrtOutputReader:
    """Turns the outputs of one TensorRT-LLM request into deltas (counts, stop strings, echo, log probs)."""

    def __init__(
        self, sampling: SamplingParams, prompt: BuiltPrompt, tokenizer: Any, *, max_tokens: int
    ) -> None:
        self._sampling = sampling
        self._prompt = prompt
        self._tokenizer = tokenizer
        self._max_tokens = max_tokens
        self._copies = greedy_copies(sampling)
        self._stops = tuple(stop for stop in sampling.stop if stop)
        self._hold = max((len(stop) for stop in self._stops), default=1) - 1
        self._choices = [_Choice() for _ in range(sampling.n // self._copies)]
        # A continued request's earlier tokens count as generated.
        self._completion_tokens = prompt.continuation_tokens
        self._echo_due = set(range(sampling.n)) if sampling.echo else set()
        self._prompt_logprobs: tuple[TokenLogprob, ...] | None = None
        self.ended = False

    def deltas(self, output: Any) -> list[Delta]:
        """The deltas of one request output; the last one is marked once every choice has ended.

        `ended` then says the request needs nothing more (the engine aborts it if it still runs:
        every choice stopped at a stop string found here).
        """
        if self.ended:
            return []
        finished = bool(output.finished)
        deltas: list[Delta] = []
        for completion in output.outputs:
            if 0 <= completion.index < len(self._choices):
                deltas += self._read(output, completion, self._choices[completion.index], finished)
        if finished or all(choice.done for choice in self._choices):
            deltas = self._end(deltas, "stop")
        return deltas

    def cut_off(self) -> list[Delta]:
        """The request ends now, without its final output (the engine gave up waiting for one)."""
        return [] if self.ended else self._end([], "abort")

    def _end(self, deltas: list[Delta], reason: FinishReason) -> list[Delta]:
        """Every choice still running ends with `reason`; the last delta ends the request."""
        for generated, choice in enumerate(self._choices):
            if not choice.done:
                choice.done = True
                deltas += self._copied(generated, "", (), reason)
        if not deltas:
            deltas.append(self._delta(0, "", (), None))
        deltas[-1].last = True
        self.ended = True
        return deltas

    def _read(self, output: Any, completion: Any, choice: _Choice, finished: bool) -> list[Delta]:
        if choice.done:
            return []
        token_ids = list(completion.token_ids or ())
        # Never the `*_diff` properties: they repeat themselves for n > 1.
        if len(token_ids) > choice.tokens:
            self._completion_tokens += (len(token_ids) - choice.tokens) * self._copies
            choice.tokens = len(token_ids)
        logprobs = self._logprobs(completion, token_ids, choice)
        text = completion.text or ""
        reason: FinishReason | None = None
        stop_at = self._stop_in(text, choice.text)
        if stop_at is not None:
            text, reason = text[:stop_at], "stop"
        elif finished or completion.finish_reason == "cancelled":
            reason = finish_reason(completion.finish_reason) or self._inferred_reason(len(token_ids))
        visible = len(text) if reason is not None else len(text) - self._hold
        new_text = text[choice.text : visible] if visible > choice.text else ""
        choice.text = max(choice.text, visible)
        if reason is not None:
            choice.done = True
        elif not new_text and not logprobs:
            return []
        return self._copied(completion.index, new_text, logprobs, reason, output)

    def _copied(
        self,
        generated: int,
        text: str,
        logprobs: tuple[TokenLogprob, ...],
        reason: FinishReason | None,
        output: Any = None,
    ) -> list[Delta]:
        deltas = []
        for copy in range(self._copies):
            index = generated * self._copies + copy
            delta_text, delta_logprobs = text, logprobs
            if index in self._echo_due:
                self._echo_due.discard(index)
                delta_text = self._prompt.text + text
                delta_logprobs = self._echoed_logprobs(output) + logprobs
            delta = self._delta(index, delta_text, delta_logprobs, reason)
            deltas.append(delta)
        return deltas

    def _delta(
        self, index: int, text: str, logprobs: tuple[TokenLogprob, ...], reason: FinishReason | None
    ) -> Delta:
        return Delta(
            text=text,
            index=index,
            logprobs=logprobs,
            prompt_tokens=self._prompt.prompt_tokens,
            completion_tokens=self._completion_tokens,
            finish_reason=reason,
        )

    def _inferred_reason(self, tokens: int) -> FinishReason:
        """A choice that ended without a reason (n > 1): it ran out of tokens, or it stopped."""
        return "length" if tokens >= self._max_tokens else "stop"

    def _stop_in(self, text: str, sent: int) -> int | None:
        """Where the first stop string begins in `text` (searched past what was surely free of one)."""
        start = max(0, sent - self._hold)
        found = [at for at in (text.find(stop, start) for stop in self._stops) if at >= 0]
        return min(found) if found else None

    # --- log probabilities ----------------------------------------------------------------------

    def _logprobs(self, completion: Any, token_ids: list[int], choice: _Choice) -> tuple[TokenLogprob, ...]:
        if self._sampling.logprobs is None or not completion.logprobs:
            return ()
        entries = completion.logprobs
        end = min(len(entries), len(token_ids))
        read = tuple(self._position(token_ids[at], entries[at]) for at in range(choice.logprobs, end))
        choice.logprobs = max(choice.logprobs, end)
        return read

    def _echoed_logprobs(self, output: Any) -> tuple[TokenLogprob, ...]:
        """The prompt tokens' log probabilities, once per request.

        TensorRT-LLM computes them from the context logits: entry `i` is the distribution after
        prompt token `i`, so prompt token `i` is read from entry `i - 1` (the first has none), and
        only its top entries are known.
        """
        if self._sampling.logprobs is None:
            return ()
        if self._prompt_logprobs is None:
            # Every choice shares the prompt: whichever has them (the first response's) will do.
            completions = getattr(output, "outputs", None) or ()
            positions = next((list(c.prompt_logprobs) for c in completions if c.prompt_logprobs), [])
            ids = self._prompt.token_ids[: self._prompt.prompt_tokens]
            self._prompt_logprobs = tuple(
                self._position(token, positions[at - 1] if 0 < at <= len(positions) else None)
                for at, token in enumerate(ids)
            )
        return self._prompt_logprobs

    def _position(self, token_id: int, candidates: Any) -> TokenLogprob:
        """One position: the chosen token and its top alternatives (TensorRT-LLM gives ids, not text)."""
        token = self._decode(token_id)
        if candidates is None:
            return TokenLogprob(token=token, logprob=None)
        if isinstance(candidates, int | float):  # only the chosen token's log probability
            return TokenLogprob(token=token, logprob=finite_logprob(float(candidates)))
        ranked: list[tuple[int, Any]] = sorted(
            candidates.items(), key=lambda item: (item[1].rank or math.inf, -item[1].logprob)
        )
        top = tuple(
            TopLogprob(token=self._decode(other), logprob=finite_logprob(entry.logprob))
            for other, entry in ranked[: self._sampling.logprobs or 0]
        )
        chosen = candidates.get(token_id)
        logprob = finite_logprob(chosen.logprob) if chosen is not None else None
        return TokenLogprob(token=token, logprob=logprob, top=top)

    def _decode(self, token_id: int) -> str:
        return str(self._tokenizer.decode([token_id]))
