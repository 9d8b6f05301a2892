"""The contract every engine keeps, checked against each engine on the demo model.

The engines: vLLM's CPU build (marked e2e, like the other tests that start a real engine), the
stand-in for TensorRT-LLM (tests/support/fake_tensorrt_llm.py; runs everywhere), and the real
TensorRT-LLM (runs where a GPU and TensorRT-LLM are both present). One engine of each kind is
started for the module and shared by the checks, in the order below; the last checks stop and
restart it, then start another one and cancel its start.

Every engine runs at most BATCH sequences at once, so that a third request waits in its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from switchboard.config import ModelConfig
from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from switchboard.wire import ChatMessage, SamplingParams, StructuredOutput, TokenLogprob
from tests.support import fake_tensorrt_llm
from tests.support.engine_processes import descendants, engine_processes, poll_until
from workers.engines.base import Delta, Engine, EngineRequest, InvalidEngineRequest

# Every check shares the module's engine, which is driven from the loop that started it.
pytestmark = pytest.mark.asyncio(loop_scope="module")

CONTEXT = 256
BATCH = 2
PROMPT = "Tell me a story."
# How long an aborted stream may take to end (TensorRT-LLM's watchdog gives up after 5 s).
ABORT_WITHIN_S = 5.0
# A schema whose every valid document is short: a grammar-bound answer must end.
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,10}$"}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}


def _vllm(model_dir: Path) -> Engine:
    from workers.engines.vllm import VllmEngine
    from workers.runtime.cpu_placement import available_cores

    args = {"max_model_len": CONTEXT, "max_num_seqs": BATCH, "dtype": "float32", "enforce_eager": True}
    core = available_cores()[0]
    return VllmEngine(
        ModelConfig(name="demo", path=str(model_dir), engine_args=args),
        cpu_threads=f"{core}-{core}",
        cpu_kvcache_gib=1,
        engine_process="fork",
    )


def _trtllm(model_dir: Path) -> Engine:
    from workers.engines.trtllm import TrtllmEngine

    # The demo model's weights are float32; TensorRT-LLM's attention kernels want 16-bit ones.
    args = {"max_seq_len": CONTEXT, "max_batch_size": BATCH, "dtype": "bfloat16"}
    return TrtllmEngine(ModelConfig(name="demo", path=str(model_dir), engine="trtllm", engine_args=args))


def _tensorrt_llm_runs_here() -> bool:
    if importlib.util.find_spec("tensorrt_llm") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@dataclass(frozen=True)
class Kind:
    """One kind of engine: how to make one, and what its process needs first."""

    make: Callable[[Path], Engine]
    prepare: Callable[[pytest.MonkeyPatch], Any]
    # Whether its engine can hold tokens before it hands them over (`EngineRequest.output_every`).
    holds_tokens: bool = False


KINDS = {
    # vLLM's CPU build sizes its KV cache from NUMA node 0 unless told (docs: ENVIRONMENT.md).
    "vllm": Kind(_vllm, lambda patch: patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1"), holds_tokens=True),
    "trtllm-stand-in": Kind(_trtllm, fake_tensorrt_llm.install),
    "trtllm": Kind(_trtllm, lambda patch: None),
}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("vllm", marks=pytest.mark.e2e),
        "trtllm-stand-in",
        pytest.param(
            "trtllm",
            marks=[
                pytest.mark.e2e,
                pytest.mark.skipif(not _tensorrt_llm_runs_here(), reason="needs a GPU and TensorRT-LLM"),
            ],
        ),
    ],
)
def kind(request: pytest.FixtureRequest) -> Iterator[Kind]:
    with pytest.MonkeyPatch.context() as patch:
        chosen = KINDS[request.param]
        chosen.prepare(patch)
        yield chosen


@pytest.fixture(scope="module")
def baseline(kind: Kind) -> set[int]:
    """The processes below this one before the module's engine started."""
    return descendants()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(kind: Kind, demo_model_dir: Path, baseline: set[int]) -> AsyncIterator[Engine]:
    started = kind.make(demo_model_dir)
    await started.start()
    yield started
    await started.stop()


@pytest.fixture(scope="module")
def no_eos(tokenizer: Any) -> dict[int, float]:
    """A logit bias that bans the end token, so that a request runs to max_tokens, and every other
    special token (`<unk>` among them), whose text a sampled answer would leave out of its text but
    not out of its log probabilities."""
    return dict.fromkeys((int(token) for token in tokenizer.all_special_ids), -100.0)


@dataclass
class Run:
    """The deltas of one request, read per choice."""

    deltas: list[Delta]

    def text(self, index: int = 0) -> str:
        return "".join(d.text for d in self.deltas if d.index == index)

    def finish(self, index: int = 0) -> str | None:
        reasons = [d.finish_reason for d in self.deltas if d.index == index and d.finish_reason]
        assert len(reasons) == 1, f"choice {index} ended {len(reasons)} times"
        return reasons[0]

    def logprobs(self, index: int = 0) -> list[TokenLogprob]:
        return [entry for d in self.deltas if d.index == index for entry in d.logprobs]

    @property
    def completion_tokens(self) -> int:
        return self.deltas[-1].completion_tokens


def request(sampling: SamplingParams, prompt: str | None = PROMPT, **fields: Any) -> EngineRequest:
    return EngineRequest(request_id=uuid.uuid4().hex, sampling=sampling, prompt=prompt, **fields)


async def run(engine: Engine, sampling: SamplingParams, prompt: str | None = PROMPT, **fields: Any) -> Run:
    deltas = [delta async for delta in engine.generate(request(sampling, prompt, **fields))]
    assert [d.last for d in deltas].count(True) == 1 and deltas[-1].last, "one last delta, at the end"
    return Run(deltas)


# --- what a started engine says and does ------------------------------------------------------------


async def test_limits_after_start(engine: Engine, tokenizer: Any) -> None:
    limits = engine.limits()
    assert limits is not None
    assert limits.max_model_len == CONTEXT
    assert limits.vocab_size == 400  # the demo model's config
    assert limits.max_token_chars >= max(len(tokenizer.decode([token])) for token in range(len(tokenizer)))
    assert engine.footprint().memory_bytes > 0


async def test_the_engine_says_how_many_requests_it_batches(engine: Engine) -> None:
    """A worker takes no more of the model's jobs at once (`workers.jobs.shares`)."""
    assert engine.max_sequences() == BATCH


async def test_a_conversation_goes_through_the_models_chat_template(engine: Engine, tokenizer: Any) -> None:
    messages = (ChatMessage(role="user", content="Hello! How are you today?"),)
    done = await run(engine, SamplingParams(max_tokens=4, temperature=0.0), prompt=None, messages=messages)
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": messages[0].content}], add_generation_prompt=True, tokenize=False
    )
    assert done.deltas[-1].prompt_tokens == len(tokenizer.encode(templated, add_special_tokens=False))
    assert done.completion_tokens > 0


async def test_greedy_decoding_is_deterministic(engine: Engine) -> None:
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    first, second = await run(engine, greedy), await run(engine, greedy)
    assert first.completion_tokens > 0
    assert (first.text(), first.completion_tokens) == (second.text(), second.completion_tokens)


async def test_a_seed_repeats_a_sample_and_no_seed_varies(engine: Engine, no_eos: dict[int, float]) -> None:
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, logit_bias=no_eos)
    assert (await run(engine, seeded)).text() == (await run(engine, seeded)).text()
    unseeded = SamplingParams(max_tokens=16, temperature=1.0, logit_bias=no_eos)
    texts = {(await run(engine, unseeded)).text() for _ in range(3)}
    assert len(texts) > 1, "unseeded requests sample alike"


async def test_two_choices(engine: Engine, no_eos: dict[int, float]) -> None:
    sampled = await run(engine, SamplingParams(n=2, max_tokens=8, temperature=1.0, seed=5, logit_bias=no_eos))
    assert {d.index for d in sampled.deltas} == {0, 1}
    assert sampled.finish(0) == sampled.finish(1) == "length"
    assert sampled.completion_tokens == 2 * 8
    assert sampled.text(0) != sampled.text(1), "one seed, two different choices"
    greedy = await run(engine, SamplingParams(n=2, max_tokens=8, temperature=0.0))
    assert greedy.text(0) == greedy.text(1) and greedy.finish(1) in ("stop", "length")


async def test_length_ends_at_exactly_max_tokens(engine: Engine, no_eos: dict[int, float]) -> None:
    done = await run(engine, SamplingParams(max_tokens=7, temperature=0.0, logprobs=0, logit_bias=no_eos))
    assert done.finish() == "length"
    assert done.completion_tokens == 7 == len(done.logprobs())


async def test_a_stop_string_never_leaks(engine: Engine, no_eos: dict[int, float]) -> None:
    greedy = SamplingParams(max_tokens=24, temperature=0.0, logprobs=0, logit_bias=no_eos)
    reference = await run(engine, greedy)
    text = reference.text()
    stop = _split_stop(text, [entry.token for entry in reference.logprobs()])
    stopped = await run(
        engine, SamplingParams(max_tokens=24, temperature=0.0, logit_bias=no_eos, stop=(stop,))
    )
    assert stopped.text() == text[: text.find(stop)]
    assert stopped.finish() == "stop"


def _split_stop(text: str, tokens: list[str]) -> str:
    """Two characters across a token boundary in the middle of `text` (a stop string split in two)."""
    assert len(text) >= 8, f"too short a reference: {text!r}"
    if "".join(tokens) == text:
        ends = [sum(map(len, tokens[: i + 1])) for i in range(len(tokens) - 1)]
        middle = [end for end in ends if len(text) // 4 <= end <= 3 * len(text) // 4]
        if middle:
            return text[middle[0] - 1 : middle[0] + 1]
    return text[len(text) // 2 : len(text) // 2 + 2]


async def test_abort_mid_stream_ends_the_stream(engine: Engine, no_eos: dict[int, float]) -> None:
    one = request(SamplingParams(max_tokens=CONTEXT - 16, temperature=1.0, logit_bias=no_eos))
    stream = engine.generate(one)
    first = await anext(stream)
    assert first.finish_reason is None
    aborted = time.monotonic()
    await engine.abort(one.request_id)
    rest = [delta async for delta in stream]
    assert time.monotonic() - aborted < ABORT_WITHIN_S
    assert (rest[-1].finish_reason, rest[-1].last) == ("abort", True)


async def test_abort_while_queued_ends_the_stream(engine: Engine, no_eos: dict[int, float]) -> None:
    long = SamplingParams(max_tokens=CONTEXT - 16, temperature=1.0, logit_bias=no_eos)
    fillers = [request(long) for _ in range(BATCH)]
    seen: dict[str, list[Delta]] = {one.request_id: [] for one in fillers}

    async def read(one: EngineRequest) -> None:
        async for delta in engine.generate(one):
            seen[one.request_id].append(delta)

    readers = [asyncio.create_task(read(one)) for one in fillers]
    try:
        await poll_until(lambda: all(seen.values()), 30, "every filler streaming")
        queued = request(long)
        seen[queued.request_id] = []
        waiting = asyncio.create_task(read(queued))
        await asyncio.sleep(0.3)  # handed to the engine, behind the fillers
        aborted = time.monotonic()
        await engine.abort(queued.request_id)
        await asyncio.wait_for(waiting, ABORT_WITHIN_S)
        assert time.monotonic() - aborted < ABORT_WITHIN_S
        last = seen[queued.request_id][-1]
        assert (last.finish_reason, last.last) == ("abort", True)
    finally:
        for one in fillers:
            await engine.abort(one.request_id)
        await asyncio.wait_for(asyncio.gather(*readers), ABORT_WITHIN_S + 1)


async def test_an_unknown_abort_is_a_no_op(engine: Engine) -> None:
    await engine.abort("nobody-sent-this")
    assert (await run(engine, SamplingParams(max_tokens=2, temperature=0.0))).completion_tokens > 0


async def test_what_cannot_fit_is_refused_with_openais_codes(engine: Engine) -> None:
    async def refusal(sampling: SamplingParams, prompt: str = PROMPT) -> InvalidEngineRequest:
        with pytest.raises(InvalidEngineRequest) as refused:
            await run(engine, sampling, prompt)
        return refused.value

    too_long = await refusal(SamplingParams(max_tokens=4), "story " * CONTEXT)
    assert (too_long.param, too_long.code) == ("prompt", CONTEXT_LENGTH_EXCEEDED)
    too_many = await refusal(SamplingParams(max_tokens=CONTEXT))
    assert (too_many.param, too_many.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    none = await refusal(SamplingParams(max_tokens=0))
    assert (none.param, none.code) == ("max_tokens", "invalid_value")


async def test_logprobs_of_each_token_with_the_top_alternatives(
    engine: Engine, no_eos: dict[int, float]
) -> None:
    done = await run(engine, SamplingParams(max_tokens=6, temperature=1.0, logprobs=2, logit_bias=no_eos))
    entries = done.logprobs()
    assert len(entries) == done.completion_tokens == 6
    assert "".join(entry.token for entry in entries) == done.text()
    for entry in entries:
        assert entry.logprob is not None and entry.logprob <= 0
        assert len(entry.top) == 2
        assert entry.top[0].logprob >= entry.top[1].logprob


async def test_tokens_held_in_the_engine_arrive_whole_in_fewer_outputs(
    engine: Engine, kind: Kind, no_eos: dict[int, float]
) -> None:
    sampling = SamplingParams(max_tokens=12, temperature=0.0, logprobs=1, logit_bias=no_eos)
    each = await run(engine, sampling)
    held = await run(engine, sampling, output_every=4)
    assert held.text() == each.text() and held.completion_tokens == each.completion_tokens == 12
    assert [entry.token for entry in held.logprobs()] == [entry.token for entry in each.logprobs()]
    assert (held.finish(), len(held.logprobs())) == ("length", 12)
    if kind.holds_tokens:
        # The first token at once, then every fourth (the last with its finish).
        assert len(held.deltas) <= 1 + 3
        assert held.deltas[0].completion_tokens == 1


async def test_a_logit_bias_bans_a_token(engine: Engine, tokenizer: Any) -> None:
    greedy = SamplingParams(max_tokens=4, temperature=0.0, logprobs=0)
    first = (await run(engine, greedy)).logprobs()[0].token
    banned = {token: -100.0 for token in range(len(tokenizer)) if tokenizer.decode([token]) == first}
    assert banned, f"no token decodes to {first!r}"
    biased = SamplingParams(max_tokens=4, temperature=0.0, logprobs=0, logit_bias=banned)
    assert (await run(engine, biased)).logprobs()[0].token != first


async def test_json_schema_output_parses_and_ends(engine: Engine) -> None:
    structured = StructuredOutput(json_schema=json.dumps(PERSON))
    done = await run(engine, SamplingParams(max_tokens=100, temperature=1.0, seed=11, structured=structured))
    answer = json.loads(done.text())
    assert set(answer) == {"name", "ok"} and re.fullmatch("[a-z]{1,10}", answer["name"])
    assert isinstance(answer["ok"], bool)
    assert done.finish() == "stop"


def _nested_schema(levels: int) -> dict[str, Any]:
    """A schema whose objects nest `levels` deep as vLLM counts them (an object and its properties: 2)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# Structured outputs the engine itself refuses: they must come back as the client's error, which the
# front door answers with a 400, and never as an engine failure (a 500). The front door refuses the
# first two itself; the engine's refusal is what stands where a front door's check cannot be exact.
ENGINE_REFUSES = {
    "a schema nested 65 levels": StructuredOutput(json_schema=json.dumps(_nested_schema(65))),
    "a regex with a NUL": StructuredOutput(regex="a\x00b"),
    "a regex with a lookbehind": StructuredOutput(regex="(?<=a)b"),
    "an invalid grammar": StructuredOutput(grammar="root ::= ("),
}
# What TensorRT-LLM refuses of them: what its grammar backend (xgrammar) cannot compile. The nesting
# bound is vLLM's own check; xgrammar compiles such a schema.
GRAMMAR_BACKEND_REFUSES = ("a regex with a NUL", "a regex with a lookbehind", "an invalid grammar")


async def test_a_structured_output_the_engine_refuses_is_the_clients_error(
    engine: Engine, kind: Kind
) -> None:
    refused_here = list(ENGINE_REFUSES) if kind.make is _vllm else list(GRAMMAR_BACKEND_REFUSES)
    if kind is KINDS["trtllm-stand-in"]:
        pytest.importorskip("xgrammar", reason="the stand-in compiles guides with xgrammar, as TensorRT-LLM")
    for name in refused_here:
        with pytest.raises(InvalidEngineRequest) as refused:
            await run(engine, SamplingParams(max_tokens=4, structured=ENGINE_REFUSES[name]))
        message = str(refused.value)
        assert message.startswith("The model's engine refused the request: "), (name, message)
        # The engine's reason, without the native library's source paths.
        assert not re.search(r"/\w+/\w+\.(cc|py)\b", message), (name, message)
    # The engine serves on, and a schema at the bound runs.
    at_bound = StructuredOutput(json_schema=json.dumps(_nested_schema(63)))
    assert (
        await run(engine, SamplingParams(max_tokens=2, temperature=0.0, structured=at_bound))
    ).completion_tokens > 0


async def test_a_continuation_counts_its_tokens_as_generated(
    engine: Engine, tokenizer: Any, no_eos: dict[int, float]
) -> None:
    continuation = " once upon"
    already = len(tokenizer.encode(continuation, add_special_tokens=False))
    sampling = SamplingParams(max_tokens=10, temperature=0.0, logprobs=0, logit_bias=no_eos)
    done = await run(engine, sampling, continuation=continuation)
    assert done.finish() == "length"
    assert done.completion_tokens == 10 and len(done.logprobs()) == 10 - already
    assert done.deltas[-1].prompt_tokens == len(tokenizer.encode(PROMPT))


async def test_echo_repeats_the_prompt_with_its_logprobs(engine: Engine, tokenizer: Any) -> None:
    done = await run(engine, SamplingParams(max_tokens=4, temperature=0.0, logprobs=0, echo=True))
    assert done.text().startswith(PROMPT)
    prompt_tokens = len(tokenizer.encode(PROMPT))
    entries = done.logprobs()
    assert len(entries) == prompt_tokens + done.completion_tokens
    assert entries[0].logprob is None  # the first prompt token has nothing before it


# --- stopping and starting ----------------------------------------------------------------------


async def test_stop_then_start_again(engine: Engine, baseline: set[int]) -> None:
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    before = (await run(engine, greedy)).text()
    await engine.stop()
    await poll_until(lambda: engine_processes(baseline) == [], 30, "no engine process left after stop")
    await engine.stop()  # idempotent
    await engine.start()
    try:
        assert (await run(engine, greedy)).text() == before, "the same weights answer the same"
    finally:
        await engine.stop()
    await poll_until(lambda: engine_processes(baseline) == [], 30, "no engine process left after stop")


async def test_a_cancelled_start_leaves_no_process(kind: Kind, demo_model_dir: Path) -> None:
    before = descendants()
    cancelled = kind.make(demo_model_dir)
    start = asyncio.create_task(cancelled.start())
    await poll_until(lambda: bool(engine_processes(before)) or start.done(), 120, "an engine process")
    assert not start.done(), "the start ended before it could be cancelled"
    start.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await start
    assert start.cancelled()
    # The build runs to its end in its thread, then the engine it built is shut down.
    await poll_until(lambda: engine_processes(before) == [], 120, "no engine process left")
