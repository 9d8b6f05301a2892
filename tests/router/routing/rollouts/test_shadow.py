"""Shadow traffic's pieces (`router.routing.rollouts.shadow`): the config's checks, the draw, the rules that
drop a copy before it is queued, the copy itself, and how an answer's chunks make its outcome."""

from __future__ import annotations

import random
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from router.routing.rollouts.shadow import (
    ComparedAnswer,
    ShadowTraffic,
    drawn,
    dropped_before_queueing,
    shadow_copy,
)
from router.status.model_status import ModelStatus
from switchboard.cli.main import parse_args
from switchboard.cli.shadow import pair_of
from switchboard.config import ConfigError, RouteConfig, Settings, ShadowConfig, load_settings
from switchboard.wire import Chunk, JobError, SamplingParams, Usage
from switchboard.wire import Job as WireJob
from tests.support.metric_samples import counter

MODELS = """
[[models]]
name = "chat-v1"
path = "/m/1"

[[models]]
name = "chat-v2"
path = "/m/2"

[[models]]
name = "chat-v3"
path = "/m/3"

[routes.chat]
targets = {"chat-v1" = 90, "chat-v2" = 10}
"""


def settings_with(tmp_path: Path, shadow: str) -> Settings:
    path = tmp_path / "sb.toml"
    path.write_text(MODELS + "\n[routes.chat.shadow]\n" + shadow)
    return load_settings(path, environ={})


def test_a_shadow_reads_from_the_config_with_its_defaults(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, 'model = "chat-v3"\npercent = 0.5\n')
    assert settings.routes["chat"].shadow == ShadowConfig(
        model="chat-v3", percent=0.5, max_waiting=4, may_load=False, keep_answers=False
    )


@pytest.mark.parametrize(
    ("shadow", "says"),
    [
        ('model = "chat-v9"\npercent = 5', "model 'chat-v9' is not configured"),
        ('model = "chat-v2"\npercent = 5', "is a target of the route"),
        ('model = "chat-v3"\npercent = 100.5', "invalid configuration"),
        ('model = "chat-v3"\npercent = -1', "invalid configuration"),
        ('model = "chat-v3"\npercent = 5\nmax_waiting = 0', "invalid configuration"),
        ('model = "chat-v3"', "invalid configuration"),  # percent is required
        ('model = "chat-v3"\npercent = 5\nmirror = true', "invalid configuration"),
    ],
)
def test_a_shadow_the_config_cannot_use_is_a_config_error(tmp_path: Path, shadow: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        settings_with(tmp_path, shadow)


def test_the_draw_copies_its_percent_of_requests() -> None:
    assert not drawn(0, lambda: 0.0)
    assert drawn(100, lambda: 0.999999)
    assert drawn(0.5, lambda: 0.004) and not drawn(0.5, lambda: 0.005)
    rng = random.Random(7)
    copies = sum(drawn(12.5, rng.random) for _ in range(20_000))
    assert abs(copies - 2_500) < 4 * (20_000 * 0.125 * 0.875) ** 0.5


def status(state: str = "warm", waiting: int = 0) -> ModelStatus:
    return ModelStatus(
        name="chat-v3",
        state=state,  # type: ignore[arg-type]
        replicas=[],
        waiting=waiting,
        in_flight=0,
        load_seconds={},
        idle_s=None,
        leaves_in_s=None,
        never_leaves=False,
    )


@pytest.mark.parametrize(
    ("may_load", "state", "waiting", "dropped"),
    [
        (False, "warm", 0, None),
        (False, "warm", 3, None),
        (False, "warm", 4, "dropped_queue"),
        (False, "cold", 0, "dropped_cold"),
        (False, "loading", 0, "dropped_cold"),
        (False, "sleeping", 0, "dropped_cold"),
        (True, "cold", 0, None),
        (True, "cold", 4, "dropped_queue"),
    ],
)
def test_a_copy_is_dropped_when_its_model_is_cold_without_may_load_or_its_queue_is_long(
    may_load: bool, state: str, waiting: int, dropped: str | None
) -> None:
    config = ShadowConfig(model="chat-v3", percent=10, max_waiting=4, may_load=may_load)
    assert dropped_before_queueing(config, status(state, waiting)) == dropped


def test_a_copy_is_a_new_job_for_the_shadow_model_with_no_tenant_and_the_same_request() -> None:
    now = time.time()
    real = WireJob(
        id="real",
        model="chat-v1",
        sampling=SamplingParams(max_tokens=7, temperature=0.3),
        prompts=("Hi",),
        created=now,
        deadline=now + 30,
        tenant="f" * 64,
        trace={"traceparent": "00-1-2-01"},
        router_id="door",
        route="chat",
    )
    copy = shadow_copy(real, "chat-v3")
    assert copy.id != real.id and copy.model == "chat-v3" and copy.shadow and not real.shadow
    assert copy.tenant is None and copy.trace is None
    assert (copy.sampling, copy.prompts, copy.deadline, copy.route, copy.router_id) == (
        real.sampling,
        real.prompts,
        real.deadline,
        "chat",
        "door",
    )


def test_an_answers_outcome_and_times_come_from_its_chunks() -> None:
    answer = ComparedAnswer(started=10.0)
    answer.add(Chunk(text="Hel"), 10.5)
    answer.add(
        Chunk(text="lo", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=3)), 11.5
    )
    assert (answer.outcome, "".join(answer.text), answer.finish_reason) == ("answered", "Hello", "stop")
    assert answer.ttft_s == 0.5 and answer.inter_token_s == 0.5
    dropped = ComparedAnswer(started=0.0)
    dropped.add(Chunk(error=JobError(code="shadow_dropped", message="busy")), 0.1)
    assert dropped.outcome == "dropped_busy"
    failed = ComparedAnswer(started=0.0)
    failed.add(Chunk(error=JobError(code="engine_error", message="died")), 0.1)
    assert failed.outcome == "failed"


def test_the_cli_prints_a_kept_pair_as_json() -> None:
    args = parse_args(["shadow-answers", "chat", "--count", "5"])
    assert (args.command, args.route, args.count) == ("shadow-answers", "chat", 5)
    pair = pair_of(
        b"1700000000000-0",
        {
            b"request_id": b"r1",
            b"served_text": b"hi",
            b"served_ttft_s": b"0.0123",
            b"shadow_finish_reason": b"",
        },
    )
    assert pair == {
        "id": "1700000000000-0",
        "request_id": "r1",
        "served_text": "hi",
        "served_ttft_s": 0.0123,
        "shadow_finish_reason": None,
    }


class StartedTasks:
    """Stands in for the front door's TaskSet: records what would start, runs nothing."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def start(self, coroutine: Coroutine[Any, Any, Any], name: str) -> None:
        coroutine.close()
        self.names.append(name)


def shadow_traffic(tasks: StartedTasks, *, max_in_flight: int = 32) -> ShadowTraffic:
    routes = {
        "chat": RouteConfig(targets={"chat-v1": 100}, shadow=ShadowConfig(model="chat-v3", percent=100))
    }
    parts: Any = None  # the pieces a copy's task uses; none runs here
    return ShadowTraffic(
        routes,
        redis=parts,
        queue=parts,
        reader=parts,
        status=parts,
        tasks=tasks,  # type: ignore[arg-type]
        settings=parts,
        max_in_flight=max_in_flight,
    )


def mirrored(traffic: ShadowTraffic, job: WireJob) -> None:
    """`job` drawn before it is queued and, once it is, copied if the draw says so (`Pipeline._answered`)."""
    draw = traffic.draw(job)
    if draw is not None:
        traffic.mirror(job, draw)


def routed_job(job_id: str, route: str | None = "chat") -> WireJob:
    now = time.time()
    return WireJob(
        id=job_id,
        model="chat-v1",
        sampling=SamplingParams(),
        prompts=("Hi",),
        created=now,
        deadline=now + 9,
        route=route,
    )


async def test_a_request_is_copied_once_even_when_a_fallback_queues_it_again_and_unrouted_ones_never() -> (
    None
):
    tasks = StartedTasks()
    traffic = shadow_traffic(tasks)
    for job in (routed_job("r1"), routed_job("r1"), routed_job("r2", route=None)):
        # The second: the same request's job on the route's stable version.
        mirrored(traffic, job)
    assert tasks.names == ["shadow copy"] and traffic.in_flight == 1


async def test_copies_beyond_the_front_doors_bound_are_dropped_busy() -> None:
    tasks = StartedTasks()
    traffic = shadow_traffic(tasks, max_in_flight=2)
    before = counter("switchboard:shadow_requests", route="chat", model="chat-v3", outcome="dropped_busy")
    for n in range(5):
        mirrored(traffic, routed_job(f"r{n}"))
    assert len(tasks.names) == 2
    assert (
        counter("switchboard:shadow_requests", route="chat", model="chat-v3", outcome="dropped_busy")
        == before + 3
    )
