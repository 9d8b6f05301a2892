"""Serverless models through every real part: openai client → front door → Redis → workers running
real vLLM CPU engines on tiny models, loaded on demand and unloaded when idle.

Tests whose settings agree share one stack (Redis, workers, front door): the tests on one worker
(a class), and those on two workers (two classes), each on models of its own so that none sees
another's loads, in the order written (the fixtures' docstrings say where it matters); each stack
stops after its last test. No test sleeps a
fixed time: each waits for what it needs through the admin view or the openai client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
import redis

from switchboard import keys
from switchboard.catalogue import bump_catalogue
from switchboard.local.demo_model import config_entry
from switchboard.wire import worker_decoder
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
GIB = 1024**3
KIND = "cpu"


def admin(stack: Stack, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{stack.base_url}/admin/models/{model}", timeout=10) as response:
        payload: dict[str, Any] = json.loads(response.read())
        return payload


def client(stack: Stack, timeout_s: float = 300) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=timeout_s)


def chat(stack: Stack, model: str, max_tokens: int = 8) -> str:
    with client(stack) as openai_client:
        reply = openai_client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=max_tokens,
            temperature=0,  # type: ignore[arg-type]
        )
    assert reply.choices[0].finish_reason == "length"
    return reply.choices[0].message.content or ""


def engine_processes(stack: Stack, worker: int = 0) -> Iterator[psutil.Process]:
    """The worker's vLLM engine processes (vLLM titles them `VLLM::EngineCore`)."""
    for child in psutil.Process(stack.workers[worker].process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                yield child


def tree_rss(pid: int) -> int:
    total = 0
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


def console(stack: Stack) -> str:
    return stack.console_log.read_text(errors="replace")


@pytest.fixture(scope="class")
def one_worker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, demo_model_dir: Path
) -> Iterator[Stack]:
    """One worker with room for one model at a time and a minute's backoff after a failed load.

    Its models, one test's each: `ghost` (a path that does not exist), `tiny` (unloaded after 3 idle
    seconds), `tiny-a` and `tiny-b`, `tiny-late` (asked through a front door of its own with a short
    deadline), `tiny-ends` (its engine process is killed). The test that measures the worker's memory runs before the ones that leave a model
    loaded, and the one whose model cannot load first of all.
    """
    missing = tmp_path_factory.mktemp("ghost") / "no-such-model"
    config = {
        "worker": {"max_loaded_models": 1, "load_backoff_s": 60},
        "models": [
            {"name": "ghost", "path": str(missing), "engine_args": {"max_model_len": 256}},
            config_entry(demo_model_dir, name="tiny", keep_alive_s=3),
            config_entry(demo_model_dir, name="tiny-a"),
            config_entry(demo_model_dir, name="tiny-b"),
            config_entry(demo_model_dir, name="tiny-late"),
            config_entry(demo_model_dir, name="tiny-ends"),
        ],
    }
    root = tmp_path_factory.mktemp("one-worker")
    with running_stack(config, root=root, session=request.session) as stack:
        yield stack


@pytest.fixture(scope="module")
def two_workers(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, demo_model_dir: Path
) -> Iterator[Stack]:
    """Two workers with heartbeats every 0.5 s (so that the measured service rate reaches the other
    worker while a backlog lasts) and three models, one test's each: `tiny`, loaded on one worker at
    start, whose engine runs two sequences at a time (its backlogs' tests run first); `tiny-burst`;
    then `tiny-dies` (whose test kills the worker loading it, so it runs last)."""
    tiny = config_entry(demo_model_dir, name="tiny", preload=True)
    tiny["engine_args"]["max_num_seqs"] = 2
    config = {
        "models": [tiny, *(config_entry(demo_model_dir, name=name) for name in ("tiny-burst", "tiny-dies"))]
    }
    env = {"SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5"}
    root = tmp_path_factory.mktemp("two-workers")
    with running_stack(config, root=root, workers=2, env=env, session=request.session) as stack:
        stack.wait_serving("tiny")
        yield stack


def triton_inferences(stack: Stack, model: str) -> int:
    """How many requests the worker's Triton model received (Triton's own Prometheus counters)."""
    redis_client = redis.Redis.from_url(stack.redis_url)
    (worker_id,) = redis_client.zrange(keys.workers_index(), 0, -1)
    record = worker_decoder.decode(redis_client.get(keys.worker_record(worker_id.decode())))  # type: ignore[arg-type]
    with urllib.request.urlopen(
        f"http://127.0.0.1:{record.triton_metrics_port}/metrics", timeout=10
    ) as response:
        metrics = response.read().decode()
    counters = re.findall(
        rf'^nv_inference_request_(?:success|failure)\{{[^}}]*model="{model}"[^}}]*\}} (\d+)', metrics, re.M
    )
    assert counters, f"Triton reports no counters for {model}"
    return sum(int(value) for value in counters)


class TestOneWorker:
    """On `one_worker`, in this order: a model that cannot load, one unloaded when idle, two that
    take turns, one asked with a short deadline, one whose engine process is killed."""

    def test_a_load_that_fails_answers_every_waiter_and_backs_off_keeping_the_reason_in_the_log(
        self,
        one_worker: Stack,
    ) -> None:
        stack = one_worker

        async def three_at_once() -> list[BaseException | object]:
            async with openai.AsyncOpenAI(
                base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
            ) as async_client:
                return await asyncio.gather(
                    *(
                        async_client.chat.completions.create(model="ghost", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
                        for _ in range(3)
                    ),
                    return_exceptions=True,
                )

        for error in asyncio.run(three_at_once()):
            assert isinstance(error, openai.APIStatusError), error
            assert error.status_code == 503
            assert error.body["code"] == "model_load_failed"  # type: ignore[index]
            # The model's path is for the worker's log, not for every caller.
            assert "ghost" in error.message and "no-such-model" not in error.message
        with client(stack) as openai_client, pytest.raises(openai.APIStatusError) as again:
            openai_client.chat.completions.create(model="ghost", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
        assert again.value.status_code == 503
        assert 1 <= int(again.value.response.headers["Retry-After"]) <= 60
        status = admin(stack, "ghost")
        assert status["state"] == "cold" and status["failure"]["failures_in_a_row"] == 1
        assert console(stack).count("loading ghost (replica") == 1, "no new attempt during the backoff"
        assert "no-such-model" in console(stack), "the reason, with its path, is in the worker's log"

    def test_an_idle_model_unloads_after_keep_alive_returns_its_memory_and_loads_again(
        self, one_worker: Stack
    ) -> None:
        stack = one_worker
        worker_pid = stack.workers[0].process.pid
        assert not list(engine_processes(stack)), "no model is loaded before"
        idle_rss = tree_rss(worker_pid)
        chat(stack, "tiny")
        engines = list(engine_processes(stack))
        assert engines, "the engine runs in a process of its own"
        warm_rss = tree_rss(worker_pid)
        stack.wait_until(lambda: admin(stack, "tiny")["state"] == "cold", timeout_s=60, what="keep-alive")
        left = [p for p in engines if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [(p.pid, p.cmdline()) for p in left]
        cold_rss = tree_rss(worker_pid)
        returned = warm_rss - cold_rss
        print(
            f"worker tree RSS: idle {idle_rss / GIB:.2f} GiB, warm {warm_rss / GIB:.2f}, cold {cold_rss / GIB:.2f}"
        )
        assert returned > 0.5 * (warm_rss - idle_rss), "most of what the engine took is returned"
        assert "tiny unloaded" in console(stack)
        assert chat(stack, "tiny"), "the next request loads it again"
        assert admin(stack, "tiny")["load_seconds"][KIND]["samples"] == 2

    def test_two_models_on_a_one_model_worker_swap_and_every_request_is_answered(
        self, one_worker: Stack
    ) -> None:
        stack = one_worker
        for model in ("tiny-a", "tiny-b"):
            assert admin(stack, model)["state"] == "cold", "neither is loaded at start"
        for model in ["tiny-a", "tiny-b", "tiny-a", "tiny-b"]:
            assert chat(stack, model)
            assert admin(stack, model)["state"] == "warm"
        assert admin(stack, "tiny-b")["state"] == "warm"
        assert admin(stack, "tiny-a")["state"] == "cold", "room for one: the other was evicted"
        for model in ("tiny-a", "tiny-b"):
            assert admin(stack, model)["load_seconds"][KIND]["samples"] == 2
        log = console(stack)
        assert log.count("unloading tiny-a: make room for tiny-b") == 2
        assert log.count("unloading tiny-b: make room for tiny-a") == 1

    def test_a_request_whose_deadline_passes_during_the_load_gets_503_and_its_job_never_runs(
        self,
        one_worker: Stack,
    ) -> None:
        stack = one_worker
        hurried = stack.spawn_front_door(env={"SWITCHBOARD_ROUTER__REQUEST_TIMEOUT_S": "1.5"})
        with (
            openai.OpenAI(
                base_url=f"{hurried.base_url}/v1", api_key="unused", max_retries=0, timeout=300
            ) as hurried_client,
            pytest.raises(openai.APIStatusError) as refused,
        ):
            hurried_client.chat.completions.create(model="tiny-late", messages=MESSAGES, max_tokens=8)  # type: ignore[arg-type]
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "model_loading"  # type: ignore[index]
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        stack.wait_until(lambda: admin(stack, "tiny-late")["state"] == "warm", timeout_s=300, what="the load")
        stack.wait_until(lambda: admin(stack, "tiny-late")["waiting"] == 0, timeout_s=30, what="the queue")
        assert triton_inferences(stack, "tiny-late") == 0, "the expired job never reached the engine"
        stack.wait_serving("tiny-late")
        # Triton counts a job's request once the stub has sent its final response, which can come
        # just after the answer reached its client (the worker takes the chunks in process).
        stack.wait_until(
            lambda: triton_inferences(stack, "tiny-late") >= 1, timeout_s=10, what="Triton's count"
        )

    def test_a_model_whose_engine_process_is_killed_unloads_and_the_next_request_loads_it_again(
        self, one_worker: Stack
    ) -> None:
        stack = one_worker
        with client(stack, timeout_s=60) as openai_client:
            stream = openai_client.chat.completions.create(
                model="tiny-ends",
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=960,
                temperature=0,
                stream=True,
            )
            assert next(iter(stream)), "the engine is generating"
            engines = list(engine_processes(stack))
            assert engines, "the engine runs in a process of its own"
            for process in engines:
                process.kill()  # as the kernel's out-of-memory killer would
            # The job in flight ends with an error, not a hang (the unload waits for it).
            with pytest.raises(openai.APIError):
                for _ in stream:
                    pass
        stack.wait_until(
            lambda: admin(stack, "tiny-ends")["state"] == "cold", timeout_s=60, what="the unload"
        )
        assert chat(stack, "tiny-ends"), "the next request loads it again and is answered"
        assert admin(stack, "tiny-ends")["load_seconds"][KIND]["samples"] == 2
        assert "unloading tiny-ends: the vLLM engine core process of tiny-ends ended" in console(stack)


class TestBacklog:
    """On `two_workers`, first: a backlog that adds no replica, then one that adds a second."""

    # The case without a second replica first: once the other has added one, the shared stack
    # could not show that a backlog adds none.
    @pytest.mark.parametrize(("measured_load_s", "second_replica"), [(10_000.0, False), (0.5, True)])
    def test_a_backlog_adds_a_second_replica_only_when_loading_is_cheaper_than_waiting(
        self, two_workers: Stack, measured_load_s: float, second_replica: bool
    ) -> None:
        stack = two_workers
        stack.wait_serving("tiny")
        assert len(admin(stack, "tiny")["replicas"]) == 1, "one replica before the backlog"
        loads_before = console(stack).count("loading tiny (replica")
        # The load time this kind of worker "measured" before: under the test's control, written
        # as a measurement is, with the catalogue version bumped for the controllers to read it.
        redis_client = redis.Redis.from_url(stack.redis_url)
        costs = keys.measured_costs("tiny", KIND, "load")
        pipe = redis_client.pipeline()
        pipe.delete(costs)
        pipe.lpush(costs, *[measured_load_s] * 5)
        bump_catalogue(pipe)  # type: ignore[arg-type]
        pipe.execute()

        async def backlog() -> list[str]:
            async with openai.AsyncOpenAI(
                base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600
            ) as async_client:
                replies = await asyncio.gather(
                    *(
                        async_client.chat.completions.create(
                            model="tiny",
                            messages=MESSAGES,  # type: ignore[arg-type]
                            max_tokens=96,
                        )
                        for _ in range(32)
                    )
                )
            return [reply.choices[0].message.content or "" for reply in replies]

        assert all(asyncio.run(backlog()))
        added = console(stack).count("loading tiny (replica") - loads_before
        assert added == (1 if second_replica else 0), console(stack)
        if second_replica:
            stack.wait_until(
                lambda: len([r for r in admin(stack, "tiny")["replicas"] if r["state"] == "warm"]) == 2,
                timeout_s=300,
                what="the second replica to be warm",
            )


class TestTwoWorkers:
    """On `two_workers`, after the backlogs: a burst for a cold model, then a worker killed mid-load."""

    async def test_a_burst_of_16_requests_for_a_cold_model_starts_one_load_and_all_are_answered(
        self,
        two_workers: Stack,
    ) -> None:
        stack = two_workers
        async with openai.AsyncOpenAI(
            base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as async_client:
            replies = await asyncio.gather(
                *(
                    async_client.chat.completions.create(
                        model="tiny-burst",
                        messages=MESSAGES,  # type: ignore[arg-type]
                        max_tokens=8,
                        stream=index % 2 == 0,
                    )
                    for index in range(16)
                )
            )
            texts = []
            for reply in replies:
                if isinstance(reply, openai.AsyncStream):
                    texts.append(
                        "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
                    )
                else:
                    texts.append(reply.choices[0].message.content or "")
        assert len(texts) == 16 and all(texts)
        status = admin(stack, "tiny-burst")
        assert len(status["replicas"]) == 1
        assert status["load_seconds"][KIND]["samples"] == 1, "exactly one load for the burst"
        assert console(stack).count("loading tiny-burst (replica") == 1

    def test_a_worker_that_dies_while_loading_hands_the_load_to_another_worker(
        self, two_workers: Stack
    ) -> None:
        stack = two_workers
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reply = pool.submit(chat, stack, "tiny-dies")
            loader = stack.wait_until(
                lambda: next(
                    (w for w in stack.workers if f"[{w.name}] loading tiny-dies" in console(stack)), None
                ),
                timeout_s=120,
                what="a worker to start loading",
            )
            loader.kill()  # SIGKILL to the worker and everything it started, mid-load
            assert reply.result(timeout=600), "the request is answered by the other worker"
        (survivor,) = [w for w in stack.workers if w is not loader]
        assert f"[{survivor.name}] loading tiny-dies (replica 0)" in console(stack)
        # The dead worker's replica record goes once its lease runs out; the answer may come first.
        stack.wait_until(
            lambda: [r["state"] for r in admin(stack, "tiny-dies")["replicas"]] == ["warm"],
            timeout_s=60,
            what="the dead worker's replica to go, the survivor's to stay warm",
        )
