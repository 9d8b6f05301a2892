"""workers.triton.generator.fan_in: a completion of several prompts, run at once, read as one request's deltas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from switchboard.config import ModelConfig
from switchboard.wire import SamplingParams
from tests.support.scripted_engine import ScriptedEngine
from workers.engines.base import Delta, Engine, EngineRequest, Footprint, InvalidEngineRequest
from workers.triton.generator.fan_in import fan_in

HANG = "hang"
Step = Delta | BaseException | str


class StepEngine(Engine):
    """Plays one script per prompt, a step per turn of the loop: a delta, an error, or a hang."""

    def __init__(self, scripts: dict[str, Sequence[Step]]) -> None:
        super().__init__(ModelConfig(name="steps", path="unused"))
        self.scripts = scripts
        self.cancelled: list[str] = []

    async def start(self) -> None:
        pass

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        assert isinstance(request.prompt, str)
        try:
            for step in self.scripts[request.prompt]:
                await asyncio.sleep(0)  # the other prompts' turn
                if isinstance(step, BaseException):
                    raise step
                if step == HANG:
                    await asyncio.Event().wait()
                assert isinstance(step, Delta)
                yield step
        except asyncio.CancelledError:
            self.cancelled.append(request.prompt)
            raise

    async def abort(self, request_id: str) -> None:
        pass

    async def stop(self) -> None:
        pass

    def footprint(self) -> Footprint:
        return Footprint(device="cpu", memory_bytes=0)


def delta(
    text: str, prompt: int, completion: int, index: int = 0, *, finish: bool = False, last: bool = False
) -> Delta:
    return Delta(
        text=text,
        index=index,
        prompt_tokens=prompt,
        completion_tokens=completion,
        finish_reason="stop" if finish else None,
        last=last,
    )


def requests(*prompts: str, n: int = 1) -> list[EngineRequest]:
    sampling = SamplingParams(n=n, max_tokens=8)
    return [EngineRequest(request_id=f"r{i}", sampling=sampling, prompt=p) for i, p in enumerate(prompts)]


async def run(engine: Engine, prompts: Sequence[str], n: int = 1) -> list[Delta]:
    queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
    await asyncio.wait_for(fan_in(engine, requests(*prompts, n=n), n, queue), timeout=10)
    out: list[Delta] = []
    while not queue.empty():
        item = queue.get_nowait()
        assert isinstance(item, Delta)
        out.append(item)
    return out


def two_choices(name: str, prompt_tokens: int) -> list[Step]:
    return [
        delta(f"{name}:0", prompt_tokens, 1, index=0),
        delta(f"{name}:1", prompt_tokens, 2, index=1),
        delta(f"{name}:0.", prompt_tokens, 3, index=0, finish=True),
        delta(f"{name}:1.", prompt_tokens, 4, index=1, finish=True, last=True),
    ]


async def test_choices_are_numbered_by_prompt_then_choice() -> None:
    engine = StepEngine({"a": two_choices("a", 3), "b": two_choices("b", 4), "c": two_choices("c", 5)})
    out = await run(engine, ["a", "b", "c"], n=2)
    assert len(out) == 12
    numbered = {d.text: d.index for d in out}
    assert numbered == {
        "a:0": 0, "a:1": 1, "a:0.": 0, "a:1.": 1,
        "b:0": 2, "b:1": 3, "b:0.": 2, "b:1.": 3,
        "c:0": 4, "c:1": 5, "c:0.": 4, "c:1.": 5,
    }  # fmt: skip
    # Every choice finishes once.
    assert sorted(d.index for d in out if d.finish_reason is not None) == [0, 1, 2, 3, 4, 5]
    # The prompts ran at once, not one after the other.
    assert [d.text for d in out[:3]] == ["a:0", "b:0", "c:0"]


async def test_counts_are_the_sum_over_prompts() -> None:
    scripts: dict[str, list[Step]] = {
        "a": [delta("a1", 4, 1), delta("a2", 4, 2, finish=True, last=True)],
        "b": [delta("b1", 6, 1), delta("b2", 6, 2), delta("b3", 6, 3, finish=True, last=True)],
    }
    out = await run(StepEngine(scripts), ["a", "b"])
    # What each prompt's request had reported when each delta went out.
    latest = {"a": (0, 0), "b": (0, 0)}
    originals = {step.text: step for script in scripts.values() for step in script if isinstance(step, Delta)}
    for item in out:
        original = originals[item.text]
        latest[item.text[0]] = (original.prompt_tokens, original.completion_tokens)
        assert item.prompt_tokens == sum(prompt for prompt, _ in latest.values()), item.text
        assert item.completion_tokens == sum(completion for _, completion in latest.values()), item.text
    assert (out[-1].prompt_tokens, out[-1].completion_tokens) == (10, 5)


@pytest.mark.parametrize(("short", "long"), [("a", "b"), ("b", "a")])
async def test_only_the_final_delta_is_last(short: str, long: str) -> None:
    scripts: dict[str, list[Step]] = {
        short: [delta(f"{short}1", 2, 1, finish=True, last=True)],
        long: [delta(f"{long}{i}", 2, i) for i in range(1, 4)]
        + [delta(f"{long}4", 2, 4, finish=True, last=True)],
    }
    out = await run(StepEngine(scripts), ["a", "b"])
    assert len(out) == 5
    assert [d.last for d in out] == [False, False, False, False, True]
    assert out[-1].text == f"{long}4"
    # The prompt that ended first still ends its choice.
    (early,) = [d for d in out if d.text == f"{short}1"]
    assert early.finish_reason == "stop"
    assert early.last is False


async def test_an_error_cancels_the_others_and_is_raised_as_it_is() -> None:
    failure = InvalidEngineRequest("The prompt is too long.", param="prompt", code="context_length_exceeded")
    scripts: dict[str, list[Step]] = {
        "ok": [delta("ok1", 2, 1), HANG],
        "bad": [delta("bad1", 2, 1), failure],
        "slow": [HANG],
    }
    engine = StepEngine(scripts)
    queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
    with pytest.raises(InvalidEngineRequest) as caught:
        await asyncio.wait_for(fan_in(engine, requests("ok", "bad", "slow"), 1, queue), timeout=10)
    assert caught.value is failure
    assert not isinstance(caught.value, BaseExceptionGroup)
    assert (caught.value.param, caught.value.code) == ("prompt", "context_length_exceeded")
    assert sorted(engine.cancelled) == ["ok", "slow"]
    sent = [queue.get_nowait() for _ in range(queue.qsize())]
    assert not any(isinstance(item, Delta) and item.last for item in sent)


async def test_two_failures_raise_one_of_them() -> None:
    scripts: dict[str, list[Step]] = {"x": [RuntimeError("x failed")], "y": [RuntimeError("y failed")]}
    queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
    with pytest.raises(RuntimeError, match=r"^(x|y) failed$"):
        await fan_in(StepEngine(scripts), requests("x", "y"), 1, queue)


async def test_with_the_scripted_engine() -> None:
    engine = ScriptedEngine()
    out = await run(engine, ["fast 2", "fast 3"])
    assert sorted(engine.requests) == ["r0", "r1"]
    assert sorted((d.index, d.text) for d in out) == [
        (0, "t0\x00 "),
        (0, "t1\x00 "),
        (1, "t0\x00 "),
        (1, "t1\x00 "),
        (1, "t2\x00 "),
    ]
    assert [d.last for d in out] == [False] * 4 + [True]
    assert (out[-1].prompt_tokens, out[-1].completion_tokens) == (6, 5)


async def test_with_the_scripted_engine_an_invalid_prompt_stops_the_rest() -> None:
    engine = ScriptedEngine()
    queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
    started = asyncio.get_running_loop().time()
    with pytest.raises(InvalidEngineRequest):
        await asyncio.wait_for(fan_in(engine, requests("hang", "invalid"), 1, queue), timeout=10)
    # `hang` would run for hours; it was cancelled instead.
    assert asyncio.get_running_loop().time() - started < 5
