"""Fixtures of the end-to-end tests: the shared `stack` and its clients, and `start_stack`.

What they start, and how a test uses it, is told in tests/support/stack.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI

from switchboard.local.demo_model import build_demo_model, config_entry
from tests.support.stack import (
    BROKEN_ROUTER_PIPELINE,
    BROKEN_VERSION,
    CASCADE_MIN_MEAN_LOGPROB,
    CASCADE_PIPELINE,
    COLD_VERSION,
    MODEL,
    PIPELINE,
    ROUTE,
    ROUTER_PIPELINE,
    SECOND_VERSION,
    SECOND_VERSION_SEED,
    SPANS_FILE,
    TRACED_VERSION,
    TWO_WORKERS_REQUEST_TIMEOUT_S,
    WARM_ROUTER_PIPELINE,
    Stack,
    running_stack,
)


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model, built once per test session."""
    return build_demo_model(tmp_path_factory.mktemp("demo-model") / "model")


@pytest.fixture(scope="session")
def second_version_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second version of the demo model (other weights, same shape): it answers differently."""
    return build_demo_model(tmp_path_factory.mktemp("demo-model-v2") / "model", seed=SECOND_VERSION_SEED)


@pytest.fixture
def start_stack(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[..., contextlib.AbstractContextManager[Stack]]:
    """`start_stack(config, *, workers=1, env=None, worker_env=(), ready_timeout_s=...)`: see the module doc."""
    started = 0

    def start(config: str | Mapping[str, Any], **options: Any) -> contextlib.AbstractContextManager[Stack]:
        nonlocal started
        started += 1
        return running_stack(config, root=tmp_path / f"stack-{started}", session=request.session, **options)

    return start


# Package scope: the engine stops when the end-to-end tests are done, so its busy compute
# threads do not slow the rest of the suite.
@pytest.fixture(scope="package")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    demo_model_dir: Path,
    second_version_dir: Path,
) -> Iterator[Stack]:
    """Redis, a worker with the demo model loaded and answering, and the front door.

    Beside the demo model, the configuration holds a route over it and two other versions, which
    load only when a test asks: a second version that answers differently, and one that cannot load
    (tests/e2e/test_routes_and_pipelines.py), and a pipeline of fallbacks from the broken one to the
    demo model; and a version only the tracing test loads. Every process exports its spans to
    SPANS_FILE in the stack's folder. The last tests to use it (tests/e2e/test_worker_faults.py)
    kill its worker and start another."""
    config = {
        "models": [
            # Its tool calls, when it makes any, are in the Python-like list syntax.
            config_entry(demo_model_dir, preload=True, tool_call_parser="pythonic"),
            config_entry(second_version_dir, name=SECOND_VERSION),
            {**config_entry(demo_model_dir, name=BROKEN_VERSION), "path": "/nonexistent/model"},
            config_entry(demo_model_dir, name=COLD_VERSION),
            # Unloaded soon after its test, so that it holds none of the worker's room.
            config_entry(demo_model_dir, name=TRACED_VERSION, keep_alive_s=5),
        ],
        "routes": {ROUTE: {"targets": {MODEL: 100, SECOND_VERSION: 0, BROKEN_VERSION: 0}}},
        "pipelines": {
            PIPELINE: {"fallbacks": [BROKEN_VERSION, MODEL]},
            ROUTER_PIPELINE: router_steered_to_b(demo_model_dir, MODEL, SECOND_VERSION),
            WARM_ROUTER_PIPELINE: router_steered_to_b(demo_model_dir, MODEL, COLD_VERSION, warm_margin=1.0),
            BROKEN_ROUTER_PIPELINE: router_steered_to_b(demo_model_dir, BROKEN_VERSION, SECOND_VERSION),
            CASCADE_PIPELINE: {
                "cascade": {
                    "draft": MODEL,
                    "strong": SECOND_VERSION,
                    "min_mean_logprob": CASCADE_MIN_MEAN_LOGPROB,
                }
            },
        },
    }
    root = tmp_path_factory.mktemp("e2e")
    env = {
        # Heartbeats every 0.5 s: tests/e2e/test_worker_faults.py loses the worker, and its jobs
        # wait for the worker started next.
        "SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5",
        # Every process's spans in one file, soon after they end (tests/e2e/test_observability.py).
        "SWITCHBOARD_TRACE_FILE": str(root / SPANS_FILE),
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    with running_stack(config, root=root, env=env, session=request.session) as stack:
        # Models load on demand: one answered request, so that no test pays for the load.
        stack.wait_serving(MODEL)
        yield stack


def router_steered_to_b(
    model_dir: Path, router: str, b_target: str, *, warm_margin: float = 0.0
) -> dict[str, Any]:
    """A router pipeline whose router model (`router`) is steered by a logit bias to label "B" (the
    demo tokenizer has "A" and "B" as tokens of their own); "A", the demo model, is the default."""
    from transformers import AutoTokenizer

    b_token = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids("B")
    targets = {
        "A": {"model": MODEL, "description": "short questions"},
        "B": {"model": b_target, "description": "long questions"},
    }
    return {
        "router": {
            "model": router,
            "targets": targets,
            "default": "A",
            "logit_bias": {str(b_token): 100},
            "warm_margin": warm_margin,
            "timeout_s": 30,
        }
    }


# The beats of the `two_workers` stack: a killed worker's jobs are found and taken over within a
# second of its record's expiry.
FAST_TAKEOVER = {"SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5", "SWITCHBOARD_WORKER__TAKEOVER_CHECK_S": "0.5"}


# Package scope: the soak (tests/e2e/test_soak.py) and the stream takeover
# (tests/e2e/test_stream_takeover.py), which run one after the other, share its start.
@pytest.fixture(scope="package")
def two_workers(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, demo_model_dir: Path
) -> Iterator[Stack]:
    """A Redis keeping its append-only file, two workers each holding the demo model warm
    (`min_replicas = 2`) with heartbeats and takeover checks every 0.5 s, and the front door.

    Its tests kill workers (starting replacements) and restart Redis: each begins by waiting until
    two workers hold the model warm again."""
    config = {
        "router": {"request_timeout_s": TWO_WORKERS_REQUEST_TIMEOUT_S},
        "models": [config_entry(demo_model_dir, preload=True, min_replicas=2)],
    }
    root = tmp_path_factory.mktemp("two-workers")
    with running_stack(
        config, root=root, workers=2, env=FAST_TAKEOVER, persist_redis=True, session=request.session
    ) as stack:
        yield stack


@pytest.fixture
def client(stack: Stack) -> Iterator[OpenAI]:
    """The official openai client pointed at the front door."""
    with OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120) as openai:
        yield openai


@pytest.fixture
async def async_client(stack: Stack) -> AsyncOpenAI:
    """The official async openai client pointed at the front door."""
    return AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
