"""LoRA adapters served on a warm base, through every real part: the openai client → front door →
Redis → a worker whose vLLM CPU engine runs the demo model with LoRA enabled, adapters loaded onto it
on demand. The adapters are built by the tests with `peft` (random weights), and two of them are also
served merged into the base as whole models: an adapter must answer exactly as its merged model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from switchboard.local.demo_model import config_entry
from tests.support.adapters import break_adapter, build_adapter, build_merged
from tests.support.admin_api import admin_call, ask_model, model_status
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

BASE = "demo"
ADAPTERS = [f"ft-{n}" for n in range(1, 9)]
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def adapter_dirs(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: build_adapter(demo_model_dir, root / name, seed=n) for n, name in enumerate(ADAPTERS, 1)}


@pytest.fixture(scope="module")
def lora_stack(
    demo_model_dir: Path,
    adapter_dirs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("lora-stack")
    merged = {
        f"merged-{name}": build_merged(demo_model_dir, adapter_dirs[name], root / f"merged-{name}")
        for name in ADAPTERS[:2]
    }
    broken = break_adapter(adapter_dirs[ADAPTERS[0]], root / "broken")
    models: list[dict[str, Any]] = [config_entry(demo_model_dir, name=BASE, preload=True)]
    models += [{"name": name, "base": BASE, "path": str(path)} for name, path in adapter_dirs.items()]
    models.append({"name": "broken", "base": BASE, "path": str(broken)})
    models += [config_entry(path, name=name) for name, path in merged.items()]
    config = {"worker": {"max_loaded_models": 3}, "models": models}
    with running_stack(config, root=root / "stack", session=request.session) as stack:
        stack.wait_serving(BASE)
        yield stack


def chat(stack: Stack, model: str, max_tokens: int = 12) -> str:
    with openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as client:
        reply = client.chat.completions.create(
            model=model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
        )
    return reply.choices[0].message.content or ""


def test_an_adapters_first_request_on_a_warm_base_loads_only_the_adapter(lora_stack: Stack) -> None:
    before = model_status(lora_stack, BASE)["replicas"]
    assert [r["state"] for r in before] == ["warm"]
    adapter = ADAPTERS[-1]
    assert model_status(lora_stack, adapter)["state"] == "cold"

    chat(lora_stack, adapter)

    after = model_status(lora_stack, BASE)
    assert [(r["worker_id"], r["replica"]) for r in after["replicas"]] == [
        (r["worker_id"], r["replica"]) for r in before
    ]
    status = model_status(lora_stack, adapter)
    assert status["state"] == "warm" and status["base"] == BASE
    console = lora_stack.console_log.read_text()
    assert console.count(f"loading {BASE} (") == 1  # the preload, and no second base
    assert f"loading {adapter} (" in console


def test_each_adapter_answers_as_the_base_merged_with_it(lora_stack: Stack) -> None:
    base_answer = chat(lora_stack, BASE)
    for name in ADAPTERS[:2]:
        answer = chat(lora_stack, name)
        assert answer == chat(lora_stack, f"merged-{name}")
        assert answer != base_answer


async def test_eight_adapters_streamed_at_once_each_answer_as_alone(lora_stack: Stack) -> None:
    alone = {name: chat(lora_stack, name) for name in ADAPTERS}
    assert len(set(alone.values())) == len(ADAPTERS)  # every adapter answers its own way

    async with openai.AsyncOpenAI(
        base_url=f"{lora_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as client:

        async def streamed(name: str) -> str:
            stream = await client.chat.completions.create(
                model=name,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=12,
                temperature=0,
                stream=True,
            )
            return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

        together = await asyncio.gather(*(streamed(name) for name in ADAPTERS))
    assert dict(zip(ADAPTERS, together, strict=True)) == alone


def test_models_list_adapters_with_their_base(lora_stack: Stack) -> None:
    with openai.OpenAI(base_url=f"{lora_stack.base_url}/v1", api_key="unused", max_retries=0) as client:
        cards = {card.id: card for card in client.models.list()}
    assert all(getattr(cards[name], "parent", None) == BASE for name in ADAPTERS)
    assert getattr(cards[BASE], "parent", None) is None


def test_an_unknown_adapter_is_a_404(lora_stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        chat(lora_stack, "ft-unregistered")
    assert caught.value.code == "model_not_found"


def test_a_broken_adapter_fails_clearly_and_its_base_and_siblings_serve_on(lora_stack: Stack) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        chat(lora_stack, "broken")
    assert caught.value.status_code == 503
    failure = model_status(lora_stack, "broken")["failure"]
    assert failure is not None and "broken" in failure["reason"] + failure.get("detail", "")
    assert [r["state"] for r in model_status(lora_stack, BASE)["replicas"]] == ["warm"]
    assert chat(lora_stack, ADAPTERS[0]) == chat(lora_stack, f"merged-{ADAPTERS[0]}")


def test_a_base_unloaded_takes_its_adapters_along_and_an_adapters_request_brings_both_back(
    lora_stack: Stack,
) -> None:
    name = ADAPTERS[1]
    expected = chat(lora_stack, name)
    assert model_status(lora_stack, name)["state"] == "warm"
    ask_model(lora_stack, BASE, "unload")
    lora_stack.wait_until(
        lambda: (
            model_status(lora_stack, BASE)["state"] == "cold"
            and model_status(lora_stack, name)["state"] == "cold"
        ),
        timeout_s=60,
        what="the base and its adapter to leave",
    )

    assert chat(lora_stack, name) == expected  # the base loads first, then the adapter onto it
    assert (
        model_status(lora_stack, BASE)["state"] == "warm"
        and model_status(lora_stack, name)["state"] == "warm"
    )


def test_an_adapter_registered_at_run_time_serves_until_it_is_removed(
    lora_stack: Stack, adapter_dirs: dict[str, Path]
) -> None:
    name = "acme/support-v1"  # ft-1's files under a name of its own: it answers as ft-1
    entry = {"name": name, "base": BASE, "path": str(adapter_dirs[ADAPTERS[0]]), "keep_alive_s": 60}
    status, body = admin_call(lora_stack, "POST", "/admin/adapters", entry)
    assert (status, body["id"], body["source"]) == (201, name, "admin")
    assert chat(lora_stack, name) == chat(lora_stack, ADAPTERS[0])
    listed = {card["id"]: card for card in admin_call(lora_stack, "GET", "/v1/models")[1]["data"]}
    assert listed[name]["parent"] == BASE
    sources = {a["id"]: a["source"] for a in admin_call(lora_stack, "GET", "/admin/adapters")[1]["data"]}
    assert sources[name] == "admin" and sources[ADAPTERS[0]] == "config"

    # What the config could not hold is refused, and changes nothing.
    refusals = [
        ("POST", "/admin/adapters", entry, 409),  # registered already
        ("POST", "/admin/adapters", {**entry, "name": "x", "engine_args": {"seed": 1}}, 400),
        ("POST", "/admin/adapters", {**entry, "name": "x", "base": "no-such-base"}, 400),
        ("DELETE", f"/admin/adapters/{ADAPTERS[0]}", None, 409),  # the config's
        ("DELETE", "/admin/adapters/no-such-adapter", None, 404),
    ]
    for method, path, body_sent, expected in refusals:
        status, body = admin_call(lora_stack, method, path, body_sent)
        assert status == expected, (method, path, body)
        assert body["error"]["message"]
    assert model_status(lora_stack, name)["state"] == "warm"

    status, body = admin_call(lora_stack, "DELETE", f"/admin/adapters/{name}")
    assert (status, body) == (200, {"id": name, "object": "model", "deleted": True})
    with pytest.raises(openai.NotFoundError) as caught:
        chat(lora_stack, name)
    assert caught.value.code == "model_not_found"
    lora_stack.wait_until(
        lambda: f"unloading {name}: its registration was removed" in lora_stack.console_log.read_text(),
        timeout_s=30,
        what="the worker to unload the removed adapter",
    )
    assert chat(lora_stack, ADAPTERS[0]) == chat(lora_stack, f"merged-{ADAPTERS[0]}")
