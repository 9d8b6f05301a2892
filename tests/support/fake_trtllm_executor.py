"""The stand-in's executor: TensorRT-LLM's executor process, as a thread of the test process.

Each step admits waiting requests while their sequences fit in `max_batch_size`, then moves every
running sequence one token on and sends one response per sequence, as the real executor does
(for n > 1 they interleave). Aborts end a request with `cancelled` responses, unless the Faults
say to ignore them; an unset seed is 0.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.support.fake_trtllm_model import (
    ToyModel,
    UnsupportedGuide,
    guide_refusal,
    guided_text,
    log_softmax,
    top_logprobs,
)
from tests.support.fake_trtllm_types import Faults, FinishReason, Logprob, Response

# TensorRT-LLM 1.2's words before the reason a guide could not be compiled (PR #9078).
GUIDED_DECODING_ERROR = "Guided decoding error"


@dataclass
class _Sequence:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    forced: list[int] | None = None  # a guided document's tokens, then the end token
    done: bool = False


class Executor:
    """The executor process, as a thread: batches of at most max_batch_size sequences, one token per step."""

    def __init__(self, llm: Any, model: ToyModel, faults: Faults) -> None:
        self._llm = llm
        self._model = model
        self._faults = faults
        self._lock = threading.Lock()
        self._waiting: deque[Any] = deque()
        self._running: dict[int, tuple[Any, list[_Sequence], list[np.random.Generator]]] = {}
        self._aborted: set[int] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="FakeTrtExecutor", daemon=True)
        self._thread.start()

    def submit(self, result: Any) -> None:
        with self._lock:
            self._waiting.append(result)

    def abort_request(self, request_id: int) -> None:
        with self._lock:
            self._aborted.add(request_id)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self._faults.step_seconds):
            with self._lock:
                self._step()

    def _step(self) -> None:
        for result in [r for r in self._waiting if r.id in self._aborted]:
            self._waiting.remove(result)
            self._cancel(result, [_Sequence() for _ in range(result.sampling_params.n)])
        capacity = self._llm.args.max_batch_size - sum(len(s) for _, s, _ in self._running.values())
        while self._waiting and self._waiting[0].sampling_params.n <= capacity:
            result = self._waiting.popleft()
            capacity -= result.sampling_params.n
            self._admit(result)
        for request_id, (result, sequences, rngs) in list(self._running.items()):
            if request_id in self._aborted:
                del self._running[request_id]
                self._cancel(result, sequences)
                continue
            for index, sequence in enumerate(sequences):
                if not sequence.done:
                    self._advance(result, sequences, index, rngs[index])
            if all(s.done for s in sequences):
                del self._running[request_id]

    def _admit(self, result: Any) -> None:
        params = result.sampling_params
        seed = params.seed if params.seed is not None else 0  # TensorRT-LLM's default seed
        rngs = [np.random.default_rng([seed, index]) for index in range(params.n)]
        sequences = [_Sequence() for _ in range(params.n)]
        if len(result.prompt_token_ids) + params.max_tokens > self._llm.args.max_seq_len:
            result._deliver(
                _error(f"prompt and max_tokens exceed max_seq_len ({self._llm.args.max_seq_len})")
            )
            return
        # Without a guided decoding backend, 1.2 drops a request's guide (NVIDIA/TensorRT issue 4855).
        if params.guided_decoding is not None and self._llm.args.guided_decoding_backend is not None:
            refusal = guide_refusal(params.guided_decoding)
            if refusal is not None:
                # As TensorRT-LLM 1.2's executor ends a request whose guide xgrammar cannot compile
                # (PR #9078: `GuidedDecoder._build` collects the failure, `_handle_guided_decoder_errors`
                # fails that request alone), before its first token.
                result._deliver(_error(f"{GUIDED_DECODING_ERROR}: {refusal}"))
                return
            for sequence, rng in zip(sequences, rngs, strict=True):
                try:
                    text = guided_text(params.guided_decoding, rng)
                except UnsupportedGuide as exc:
                    result._deliver(_error(str(exc)))
                    return
                tokenizer = self._llm.tokenizer.tokenizer
                sequence.forced = [*tokenizer.encode(text, add_special_tokens=False), params.end_id]
        self._running[result.id] = (result, sequences, rngs)

    def _advance(self, result: Any, sequences: list[_Sequence], index: int, rng: np.random.Generator) -> None:
        params = result.sampling_params
        sequence = sequences[index]
        context = [*result.prompt_token_ids, *sequence.tokens]
        bias = None if params.embedding_bias is None else np.asarray(params.embedding_bias, dtype=np.float64)
        early = params.min_tokens is not None and len(sequence.tokens) < params.min_tokens
        banned = [params.end_id] if early and params.end_id is not None else []
        token, logprobs = self._model.next_token(context, params, rng, bias=bias, banned=banned)
        if sequence.forced is not None:
            token = sequence.forced[len(sequence.tokens)]
        sequence.tokens.append(token)
        if params.logprobs:
            ranked = top_logprobs(logprobs, params.logprobs, token)
            sequence.logprobs.append({t: Logprob(lp, rank) for t, (lp, rank) in ranked.items()})
        reason = FinishReason.NOT_FINISHED
        if token == params.end_id and not params.ignore_eos:
            reason = FinishReason.END_ID
        elif any(words and sequence.tokens[-len(words) :] == words for words in params._stop_word_ids or ()):
            reason = FinishReason.STOP_WORDS
        elif len(sequence.tokens) >= params.max_tokens:
            reason = FinishReason.LENGTH
        sequence.done = reason != FinishReason.NOT_FINISHED
        response = Response(
            sequence_index=index,
            output_token_ids=[[token]],
            finish_reasons=[reason],
            is_final=all(s.done for s in sequences),
            log_probs=[list(sequence.logprobs)] if params.logprobs else None,
            prompt_logprobs=self._prompt_logprobs(result) if len(sequence.tokens) == 1 else None,
        )
        result._deliver(response)

    def _prompt_logprobs(self, result: Any) -> list[dict[int, Logprob]] | None:
        """From the context logits: entry t is the distribution after prompt token t (top k only)."""
        k = result.sampling_params.prompt_logprobs
        if not k:
            return None
        ids = result.prompt_token_ids
        entries = []
        for end in range(1, len(ids) + 1):
            logprobs = log_softmax(self._model.logits(ids[:end]))
            entries.append(
                {t: Logprob(lp, rank) for t, (lp, rank) in top_logprobs(logprobs, k, None).items()}
            )
        return entries

    def _cancel(self, result: Any, sequences: list[_Sequence]) -> None:
        if self._faults.ignore_aborts:
            return  # the request never ends
        pending = [index for index, sequence in enumerate(sequences) if not sequence.done]
        for position, index in enumerate(pending):
            final = position == len(pending) - 1
            result._deliver(Response(index, [[]], [FinishReason.CANCELLED], is_final=final))


def _error(message: str) -> Response:
    return Response(0, [[]], [FinishReason.NOT_FINISHED], is_final=True, error=message)
