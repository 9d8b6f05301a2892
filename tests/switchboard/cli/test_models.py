"""The `switchboard models` table, rendered from real `/admin/models` payloads of a real front door."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import urllib.request
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio as aioredis
import uvicorn

from router.app import create_app
from switchboard import api_keys as key_secrets
from switchboard import keys
from switchboard.cli.models import COLUMNS, human_seconds, render_names, render_table, show_models
from switchboard.config import ApiKey, ModelConfig, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from switchboard.wire import (
    DownloadStatus,
    LoadFailure,
    SlotStatus,
    WorkerRecord,
    desired_state_decoder,
    encode,
)


@contextlib.asynccontextmanager
async def front_door(
    redis_url: str, models: list[ModelConfig], api_keys: tuple[ApiKey, ...] = ()
) -> AsyncIterator[str]:
    """A real front door on a free port (with `api_keys`, if any); yields its base URL."""
    settings = Settings(models=models)
    settings.redis.url = redis_url
    settings.auth.keys = list(api_keys)
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def advertise(redis: aioredis.Redis, record: WorkerRecord) -> None:
    await redis.set(keys.worker_record(record.id), encode(record), ex=keys.WORKER_TTL_S)
    await redis.zadd(keys.workers_index(), {record.id: time.time()})


def record(worker_id: str, host: str, kind: str, *slots: SlotStatus) -> WorkerRecord:
    now = time.time()
    return WorkerRecord(
        id=worker_id,
        host=host,
        pid=1,
        started=now,
        heartbeat=now,
        models=(),
        triton_http_port=1,
        triton_grpc_port=2,
        triton_metrics_port=3,
        kind=kind,
        slots=slots,
    )


MODELS = [
    ModelConfig(name="tiny", path="/x"),
    ModelConfig(name="big", path="/x", keep_alive_s=-1),
    ModelConfig(name="broken", path="/x"),
    ModelConfig(name="idle", path="/x"),
]


async def fill(redis: aioredis.Redis) -> float:
    """Worker-side state: tiny warm on one worker and loading on another, big held for good, broken
    failed; when (unix seconds) the state was written."""
    now = time.time()
    tiny_warm = SlotStatus(model="tiny", state="warm", replica=0, in_flight=2, waiting=3, idle_since=now - 3)
    tiny_loading = SlotStatus(
        model="tiny", state="loading", replica=1, load_started=now - 12, expected_load_s=50
    )
    big = SlotStatus(model="big", state="warm", replica=0, idle_since=now - 240)
    await advertise(redis, record("w1", "gpu-a", "H100", tiny_warm, big))
    await advertise(redis, record("w2", "gpu-b", "H100", tiny_loading))
    for seconds in (7.4, 7.0, 7.1):
        await redis.lpush(keys.measured_costs("tiny", "H100", "load"), str(seconds))
    failure = LoadFailure(
        model="broken", worker_id="w2", reason="weights not found", failed_at=now, retry_at=now + 40
    )
    await redis.set(keys.load_failure("broken"), encode(failure), ex=40)
    for _ in range(3):
        await redis.xadd(keys.job_stream("tiny"), {"job": b"x"})
    return now


async def test_the_table_renders_a_real_payload(redis: aioredis.Redis, redis_server: PrivateRedis) -> None:
    filled = await fill(redis)
    async with front_door(redis_server.url, MODELS) as url:
        payload = await asyncio.to_thread(_get_json, f"{url}/admin/models")
    # The load began 12 s before the state was written; the front door's start adds to that.
    loading_s = range(12, round(12 + time.time() - filled) + 1)
    lines = render_table(payload).splitlines()
    header, tiny, big, broken, idle, note = lines
    assert header.split() == [
        "MODEL",
        "STATE",
        "WHERE",
        "QUEUE",
        "IN-FLIGHT",
        "LAST",
        "LOAD",
        "TYPICAL",
        "LOAD",
        "IDLE",
        "LEAVES",
        "IN",
    ]
    # Columns line up: each starts where its header does.
    starts = [header.index(column) for column in COLUMNS]
    assert tiny[starts[1] :].startswith("warm")
    where = re.search(r"w1@gpu-a#0 \(2 running, 3 waiting\), w2@gpu-b#1 \(loading (\d+) s of 50 s\)", tiny)
    assert where is not None and int(where[1]) in loading_s, tiny
    assert tiny[starts[3] :].split()[:2] == ["3", "2"]
    assert tiny[starts[5] :].startswith("7.1 s")
    assert tiny[starts[6] :].startswith("7.1 s")
    assert tiny[starts[7] :].startswith("busy")
    assert tiny[starts[8] :] == "-"
    assert big.split()[:3] == ["big", "warm", "w1@gpu-a#0"]
    assert big[starts[7] :].startswith("4 min")
    assert big.endswith("never")
    assert broken.split()[:3] == ["broken", "failed", "-"]
    assert idle.split() == ["idle", "cold", "-", "0", "0", "-", "-", "-", "-"]
    assert note.startswith("broken: load failed on w2: weights not found (retry in ")


async def test_show_models_prints_the_table(
    redis: aioredis.Redis, redis_server: PrivateRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(redis)
    async with front_door(redis_server.url, MODELS) as url:
        code = await asyncio.to_thread(show_models, url + "/")
    assert code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("MODEL")
    assert len(out.splitlines()) == 6


def test_routes_and_pipelines_are_listed_under_the_table() -> None:
    cards = [
        {"id": "tiny", "owned_by": "switchboard"},
        {"id": "chat", "owned_by": "switchboard-route", "targets": ["chat-v1", "chat-v2"]},
        {"id": "resilient", "owned_by": "switchboard-pipeline", "fallbacks": ["chat", "small"]},
    ]
    assert render_names(cards).splitlines() == [
        "route chat: chat-v1, chat-v2",
        "pipeline resilient: fallbacks chat -> small",
    ]


def test_show_models_says_what_to_do_when_nothing_listens(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert show_models(url) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"switchboard: cannot reach the front door at {url} (")
    assert "switchboard up" in line


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.0, "0.0 s"), (7.14, "7.1 s"), (42.4, "42 s"), (240, "4 min"), (9000, "2.5 h")],
)
def test_human_seconds(seconds: float | None, text: str) -> None:
    assert human_seconds(seconds) == text


def test_several_worker_kinds_show_each_kind() -> None:
    model = {
        "name": "m",
        "state": "cold",
        "replicas": [],
        "waiting": 0,
        "in_flight": 0,
        "load_seconds": {
            "H100": {"last": 4.0, "typical": 5.0, "samples": 2},
            "cpu": {"last": 60, "typical": 61, "samples": 1},
        },
        "idle_s": None,
        "leaves_in_s": None,
        "never_leaves": False,
        "failure": None,
    }
    row = render_table({"data": [model]}).splitlines()[1]
    assert "4.0 s H100 / 60 s cpu" in row
    assert "5.0 s H100 / 61 s cpu" in row


def test_adapters_are_listed_under_their_base_and_the_idle_ones_counted() -> None:
    def status(name: str, base: str | None = None, **fields: object) -> dict[str, object]:
        return {"name": name, "base": base, "state": "cold", "replicas": [], "waiting": 0, **fields}

    payload = {
        "data": [
            status("llama", state="warm"),
            status("other"),
            status("ft-a", "llama", state="warm"),
            status("ft-b", "llama", waiting=2),
            *(status(f"ft-idle-{n}", "llama") for n in range(998)),
        ]
    }
    names = [line.split("  ")[0] for line in render_table(payload).splitlines()[1:]]
    assert names == ["llama", "└ ft-a", "└ ft-b", "└ 998 more adapters", "other"]


def test_a_warm_replica_with_work_shows_its_running_and_waiting_jobs() -> None:
    def replica(worker_id: str, in_flight: int, **fields: object) -> dict[str, object]:
        return {
            "worker_id": worker_id,
            "host": "h",
            "replica": None,
            "state": "warm",
            "in_flight": in_flight,
            **fields,
        }

    model = {
        "name": "m",
        "state": "warm",
        "replicas": [replica("w1", 3, waiting=7), replica("w2", 0, waiting=0), replica("w3", 1)],
        "waiting": 9,
        "in_flight": 4,
    }
    row = render_table({"data": [model]}).splitlines()[1]
    # w3 does not report its own view of the queue (an older front door): the model's is shown.
    assert "w1@h (3 running, 7 waiting), w2@h, w3@h (1 running, 9 waiting)" in row


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as response:
        payload: dict[str, object] = json.load(response)
        return payload


async def test_show_models_sends_the_admin_key(
    redis: aioredis.Redis, redis_server: PrivateRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = key_secrets.new_secret()
    admin = ApiKey(name="ops", sha256=key_secrets.digest(secret), admin=True)
    async with front_door(redis_server.url, MODELS, (admin,)) as url:
        assert await asyncio.to_thread(show_models, url) == 1
        assert "--key" in capsys.readouterr().err
        assert await asyncio.to_thread(show_models, url, secret) == 0
    assert capsys.readouterr().out.startswith("MODEL")


async def test_a_load_fetching_its_files_shows_its_progress_and_a_failed_fetch_its_reason(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    now = time.time()
    download = DownloadStatus(bytes_done=120_000_000, bytes_total=500_000_000, rate_bps=31e6, eta_s=12.3)
    fetching = SlotStatus(model="tuned", state="loading", replica=0, load_started=now - 4, download=download)
    cached = msgspec.structs.replace(record("w1", "gpu-a", "H100", fetching), node="n-a", cached=("other",))
    await advertise(redis, cached)
    detail = "fetching the files of broken from s3://models/broken failed: model.safetensors: md5 mismatch"
    failure = LoadFailure(
        model="broken", worker_id="w1", reason="the worker's log has the reason", failed_at=now,
        retry_at=now + 40, detail=detail,
    )  # fmt: skip
    await redis.set(keys.load_failure("broken"), encode(failure), ex=40)
    models = [ModelConfig(name=name, path=f"s3://models/{name}") for name in ("tuned", "broken", "other")]
    async with front_door(redis_server.url, models) as url:
        payload = await asyncio.to_thread(_get_json, f"{url}/admin/models")
    tuned, broken, other = payload["data"]
    assert broken["failure"]["detail"] == detail
    assert tuned["replicas"][0]["download"] == {
        "bytes_done": 120_000_000, "bytes_total": 500_000_000, "rate_bps": 31e6, "eta_s": 12.3,
    }  # fmt: skip
    assert other["cached_on"] == ["gpu-a"] and tuned["cached_on"] == []
    lines = render_table(payload).splitlines()
    assert "w1@gpu-a#0 (fetching 120/500 MB at 31 MB/s, 12 s left)" in lines[1]
    assert lines[-1].startswith(f"broken: load failed on w1: {detail} (retry in ")


async def test_models_prefetch_asks_every_worker_for_the_files(
    redis: aioredis.Redis, redis_server: PrivateRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    models = [ModelConfig(name="tuned", path="s3://models/tuned")]
    async with front_door(redis_server.url, models) as url:
        code = await asyncio.to_thread(show_models, url, None, ("prefetch", "tuned"))
    assert code == 0
    assert capsys.readouterr().out.startswith("asked the workers to prefetch tuned\n")
    request = desired_state_decoder.decode(await redis.get(keys.prefetch_request("tuned")))
    assert request.action == "prefetch" and abs(request.at - time.time()) < 30
    assert await redis.ttl(keys.prefetch_request("tuned")) > keys.DESIRED_TTL_S
