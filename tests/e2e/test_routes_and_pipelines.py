"""Routes and pipelines on real engines: the shared stack's route and pipeline (tests/e2e/conftest.py).

The demo model is the route's stable version; `tiny-v2` has other weights, so its greedy answers
differ; `tiny-broken` cannot load. The pipeline `tiny-resilient` tries the broken version first, then
the demo model. Whatever fails before the first byte costs the callers no error: the pipeline's next
step, or the route's stable version, answers. A rollout of the broken version is rolled back while
it warms, before any caller meets it; a rollout of `tiny-v2` warms it, steps its weight and promotes
it while callers are served by one version or the other, each answer naming the version that wrote
it. The route is left as the stack had it.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.support.stack import BROKEN_VERSION, MODEL, PIPELINE, ROUTE, SECOND_VERSION, Stack

pytestmark = pytest.mark.e2e

PROMPT: Any = [{"role": "user", "content": "Tell me about the sea."}]


def chat(http: httpx.Client, session: str, model: str = ROUTE) -> httpx.Response:
    body = {"model": model, "messages": PROMPT, "max_tokens": 8, "temperature": 0}
    return http.post("/v1/chat/completions", json=body, headers={"x-session-id": session})


def set_weights(http: httpx.Client, **weights: int) -> None:
    answer = http.put(f"/admin/routes/{ROUTE}/weights", json={"weights": weights})
    assert answer.status_code == 200, answer.text


def fallbacks_counted(http: httpx.Client, via: str) -> bool:
    """Whether the front door counted a fall-through from the broken version `via` a route or pipeline."""
    return any(
        line.startswith("switchboard:fallbacks_total{")
        and f'via="{via}"' in line
        and f'model="{BROKEN_VERSION}"' in line
        and not line.endswith(" 0.0")
        for line in http.get("/metrics").text.splitlines()
    )


def test_a_pipeline_answers_with_its_next_step_when_the_first_cannot_load(
    client: OpenAI, stack: Stack
) -> None:
    reply = client.chat.completions.with_raw_response.create(
        model=PIPELINE, messages=PROMPT, max_tokens=8, temperature=0
    )
    assert reply.headers["x-switchboard-pipeline"] == PIPELINE
    assert reply.headers["x-switchboard-model"] == MODEL
    answer = reply.parse()
    assert answer.model == MODEL and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model=PIPELINE, messages=PROMPT, max_tokens=8, temperature=0, stream=True
    )
    chunks = list(stream)
    assert {chunk.model for chunk in chunks} == {MODEL}
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == answer.choices[0].message.content, "the same greedy answer, streamed"
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        assert fallbacks_counted(http, PIPELINE)


def test_callers_split_onto_a_version_that_cannot_load_are_answered_by_the_stable_one(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=120) as http:
        try:
            set_weights(http, **{MODEL: 50, SECOND_VERSION: 0, BROKEN_VERSION: 50})
            for session in range(8):
                answer = chat(http, f"caller-{session}")
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-switchboard-model"] == MODEL == answer.json()["model"]
            assert fallbacks_counted(http, ROUTE)
        finally:
            set_weights(http, **{MODEL: 100, SECOND_VERSION: 0, BROKEN_VERSION: 0})


def rollout(http: httpx.Client) -> dict[str, Any]:
    return http.get(f"/admin/routes/{ROUTE}").json()["rollout"]


def test_a_version_that_cannot_load_is_rolled_back_before_any_caller_meets_it(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=120) as http:
        plan = {"canary": BROKEN_VERSION, "steps": [50, 100], "interval_s": 2, "min_requests": 4}
        started = http.post(f"/admin/routes/{ROUTE}/rollout", json=plan)
        assert started.status_code == 201, started.text
        deadline = time.monotonic() + 60
        session = 0
        while (state := rollout(http))["phase"] == "warming":
            assert time.monotonic() < deadline, state
            session += 1
            answer = chat(http, f"warming-{session}")
            assert answer.status_code == 200 and answer.json()["model"] == MODEL, answer.text
        assert state["phase"] == "rolled_back", state
        assert f"the canary {BROKEN_VERSION} failed to load" in state["reason"]
        weights = {t["model"]: t["weight"] for t in http.get(f"/admin/routes/{ROUTE}").json()["targets"]}
        assert weights == {MODEL: 100, SECOND_VERSION: 0, BROKEN_VERSION: 0}


def test_a_healthy_second_version_is_rolled_out_step_by_step_and_promoted(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=120) as http:
        alone = chat(http, "reference", MODEL).json()["choices"][0]["message"]["content"]
        try:
            plan = {
                "canary": SECOND_VERSION,
                "steps": [50, 100],
                "interval_s": 2,
                "min_requests": 4,
                "min_callers": 4,  # each request from a session of its own: a caller of its own
                # Two engines share two cores here: latency ratios mean little, failures do.
                "max_ttft_p95_ratio": 50,
                "max_itl_p95_ratio": 50,
                "warm_timeout_s": 120,
            }
            started = http.post(f"/admin/routes/{ROUTE}/rollout", json=plan)
            assert started.status_code == 201, started.text
            served: dict[str, set[str]] = {}
            deadline = time.monotonic() + 180
            session = 0
            while rollout(http)["phase"] not in ("promoted", "rolled_back", "aborted"):
                assert time.monotonic() < deadline, rollout(http)
                session += 1
                answer = chat(http, f"rollout-{session}")
                assert answer.status_code == 200, answer.text
                model = answer.json()["model"]
                assert answer.headers["x-switchboard-model"] == model
                served.setdefault(model, set()).add(answer.json()["choices"][0]["message"]["content"])
            final = rollout(http)
            assert final["phase"] == "promoted", final
            assert set(served) == {MODEL, SECOND_VERSION}, served
            assert served[MODEL] == {alone}, "the stable version's greedy answer, every time"
            assert alone not in served[SECOND_VERSION], "the second version answers differently"
            weights = {t["model"]: t["weight"] for t in http.get(f"/admin/routes/{ROUTE}").json()["targets"]}
            assert weights[SECOND_VERSION] == 100
        finally:
            set_weights(http, **{MODEL: 100, SECOND_VERSION: 0, BROKEN_VERSION: 0})
            http.post(f"/admin/models/{SECOND_VERSION}/unload", json={})
