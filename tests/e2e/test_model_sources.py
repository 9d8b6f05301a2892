"""Models from a bucket and from the Hub, through every real part: the openai client → front door →
Redis → workers that fetch the demo model's files from a real S3 API (moto's server on loopback) or
a local server speaking the Hub's file API into their node cache, and serve them on real vLLM CPU
engines.

Two stacks. One host: two workers sharing one node cache folder (what a host with several workers
is), for the fetch once per host, the cache hit, a failed check, the budget's eviction and a fetch
killed half way. Two hosts: two workers with a cache each, for placement by the files a node has.
Each test waits for what it needs (the admin view, the store's counters), never a fixed time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from switchboard.local.demo_model import config_entry
from tests.support.admin_api import ask_model, model_status
from tests.support.hub_server import HubServer
from tests.support.s3_store import S3Store
from tests.support.stack import MODEL, Stack, running_stack

pytestmark = pytest.mark.e2e

BUCKET = "models"
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
# The demo model's files are about 5.6 MB: a budget that holds two copies and not three.
TWO_MODELS_GIB = 12e6 / 1024**3
WEIGHTS = "model.safetensors"


def remote_entry(demo_model_dir: Path, name: str, path: str, **fields: Any) -> dict[str, Any]:
    """A `[[models]]` entry serving the demo model's files from `path` (its engine arguments as `switchboard up`'s)."""
    return {**config_entry(demo_model_dir, name=name, **fields), "path": path}


def chat(stack: Stack, model: str) -> str:
    with openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as client:
        reply = client.chat.completions.create(
            model=model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
        )
    return reply.choices[0].message.content or ""


def wait_cold(stack: Stack, model: str) -> None:
    stack.wait_until(
        lambda: model_status(stack, model)["state"] == "cold", timeout_s=60, what=f"{model} to leave"
    )


@pytest.fixture(scope="module")
def store(demo_model_dir: Path) -> Iterator[S3Store]:
    """A real S3 API on loopback holding the demo model under several prefixes, one per test model."""
    with S3Store() as s3:
        s3.create_bucket(BUCKET)
        for prefix in ("demo", "pair", "lru-a", "lru-b", "lru-c", "broken", "slow"):
            s3.upload_folder(demo_model_dir, BUCKET, prefix)
        # Parts of 5 MiB (S3's least): the weights' ETag is a multipart one, checked part by part.
        s3.upload_folder(demo_model_dir, BUCKET, "multipart", multipart_chunk_bytes=5 * 1024 * 1024)
        yield s3


@pytest.fixture(scope="module")
def hub(demo_model_dir: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo("switchboard-tests/demo", demo_model_dir)
        yield server


@pytest.fixture(scope="module")
def local_answer(stack: Stack) -> str:
    """The demo model's greedy answer from its local folder (the shared stack's): what every remote
    copy must answer."""
    return chat(stack, MODEL)


@pytest.fixture(scope="class")
def one_host(
    store: S3Store, hub: HubServer, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Two workers of one host: one node cache, its budget room for two copies of the demo model
    (stopped with its class, before the two-host stack starts)."""
    root = tmp_path_factory.mktemp("one-host")
    s3 = f"s3://{BUCKET}"
    config = {
        "worker": {
            "max_loaded_models": 1,
            "model_cache_dir": str(root / "node-cache"),
            "model_cache_gib": TWO_MODELS_GIB,
        },
        "models": [
            remote_entry(demo_model_dir, "bucket-demo", f"{s3}/demo", keep_alive_s=2),
            remote_entry(demo_model_dir, "multipart-demo", f"{s3}/multipart", keep_alive_s=0),
            remote_entry(demo_model_dir, "pair", f"{s3}/pair", keep_alive_s=0),
            remote_entry(demo_model_dir, "lru-a", f"{s3}/lru-a", keep_alive_s=0),
            remote_entry(demo_model_dir, "lru-b", f"{s3}/lru-b", keep_alive_s=0),
            remote_entry(demo_model_dir, "lru-c", f"{s3}/lru-c", keep_alive_s=0),
            remote_entry(demo_model_dir, "broken", f"{s3}/broken", keep_alive_s=0),
            remote_entry(demo_model_dir, "slow", f"{s3}/slow", keep_alive_s=0),
            remote_entry(demo_model_dir, "hub-demo", "hf://switchboard-tests/demo", keep_alive_s=0),
        ],
    }
    env = {**store.env(), **hub.env(), "SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5"}
    with running_stack(config, root=root / "stack", workers=2, env=env) as stack:
        yield stack


class TestOneHost:
    """Two workers sharing one node cache: in this order, since the budget's test counts entries."""

    def test_the_first_request_fetches_the_files_and_answers_as_the_local_folder(
        self, one_host: Stack, store: S3Store, local_answer: str
    ) -> None:
        store.reset_counts()
        assert chat(one_host, "bucket-demo") == local_answer
        assert store.object_gets(BUCKET, "demo/") >= 1
        assert model_status(one_host, "bucket-demo")["cached_on"], "the host's node cache holds it"

    def test_a_later_load_on_the_host_fetches_nothing(
        self, one_host: Stack, store: S3Store, local_answer: str
    ) -> None:
        wait_cold(one_host, "bucket-demo")
        store.reset_counts()
        assert chat(one_host, "bucket-demo") == local_answer
        assert store.object_gets(BUCKET, "demo/") == 0

    def test_two_workers_of_one_host_fetch_once(
        self, one_host: Stack, store: S3Store, demo_model_dir: Path
    ) -> None:
        store.reset_counts()
        ask_model(one_host, "pair", "prefetch")  # both workers want its files at once
        one_host.wait_until(
            lambda: model_status(one_host, "pair")["cached_on"],
            timeout_s=60,
            what="the prefetch into the node cache",
        )
        files = len([path for path in demo_model_dir.rglob("*") if path.is_file()])
        # One GET per file (none twice): the second worker waited for the first's fetch.
        assert store.object_gets(BUCKET, "pair/") == files

    def test_a_multipart_upload_is_checked_part_by_part(self, one_host: Stack, local_answer: str) -> None:
        assert chat(one_host, "multipart-demo") == local_answer

    def test_the_hub_serves_the_same_model(self, one_host: Stack, hub: HubServer, local_answer: str) -> None:
        assert chat(one_host, "hub-demo") == local_answer
        assert hub.file_gets("switchboard-tests/demo") >= 1

    def test_bytes_that_fail_their_check_are_a_load_failure_with_its_reason(
        self, one_host: Stack, store: S3Store
    ) -> None:
        store.corrupt(f"broken/{WEIGHTS}")
        with pytest.raises(openai.APIStatusError) as refused:
            chat(one_host, "broken")
        assert refused.value.status_code == 503
        assert refused.value.response.headers.get("retry-after")
        failure = model_status(one_host, "broken")["failure"]
        assert WEIGHTS in failure["detail"] and "s3://models/broken" in failure["detail"]
        assert not model_status(one_host, "broken")["cached_on"]

    def test_the_budget_evicts_the_least_recently_used_cold_model(
        self, one_host: Stack, local_answer: str
    ) -> None:
        # Room for two copies: once nothing is held, each load of another model evicts the copy used
        # longest ago (a held model's files never leave: the cache refuses the load instead).
        for held in ("bucket-demo", "multipart-demo", "hub-demo"):
            wait_cold(one_host, held)
        for model in ("lru-a", "lru-b"):
            assert chat(one_host, model) == local_answer
            wait_cold(one_host, model)
        assert model_status(one_host, "lru-a")["cached_on"] and model_status(one_host, "lru-b")["cached_on"]
        assert not model_status(one_host, "bucket-demo")["cached_on"]
        assert chat(one_host, "lru-c") == local_answer
        assert not model_status(one_host, "lru-a")["cached_on"], "the least recently used leaves"
        assert model_status(one_host, "lru-b")["cached_on"]

    def test_a_fetch_killed_half_way_leaves_nothing_used_and_resumes(
        self, one_host: Stack, store: S3Store, local_answer: str, demo_model_dir: Path
    ) -> None:
        size = (demo_model_dir / WEIGHTS).stat().st_size
        store.throttle(f"slow/{WEIGHTS}", size // 10)  # ten seconds for the weights
        ask_model(one_host, "slow", "load")

        def half_way() -> bool:
            replicas = model_status(one_host, "slow")["replicas"]
            download = replicas[0].get("download") if replicas else None
            return download is not None and int(download["bytes_done"]) > size // 3

        one_host.wait_until(half_way, timeout_s=60, what="the fetch to be a third done")
        fetcher = model_status(one_host, "slow")["replicas"][0]["worker_id"]
        victim = next(w for w in one_host.workers if f"-{w.process.pid}-" in fetcher)
        victim.kill()
        store.clear_faults()
        store.reset_counts()
        assert chat(one_host, "slow") == local_answer
        # The survivor read the rest of the weights, not all of them again.
        assert 0 < store.object_bytes(BUCKET, f"slow/{WEIGHTS}") < size


@pytest.fixture(scope="module")
def two_hosts(
    store: S3Store, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Two workers, each with a node cache of its own (two hosts, as far as files go)."""
    root = tmp_path_factory.mktemp("two-hosts")
    config = {
        "worker": {"max_loaded_models": 1},
        "models": [remote_entry(demo_model_dir, "placed", f"s3://{BUCKET}/demo", keep_alive_s=0)],
    }
    worker_env = [{"SWITCHBOARD_WORKER__MODEL_CACHE_DIR": str(root / f"node-{n}")} for n in range(2)]
    env = {**store.env(), "SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5"}
    with running_stack(config, root=root / "stack", workers=2, env=env, worker_env=worker_env) as stack:
        yield stack


def test_a_cold_model_loads_where_its_files_are(two_hosts: Stack, store: S3Store, local_answer: str) -> None:
    assert chat(two_hosts, "placed") == local_answer
    for _ in range(3):
        wait_cold(two_hosts, "placed")
        store.reset_counts()
        assert chat(two_hosts, "placed") == local_answer
        assert store.object_gets(BUCKET, "demo/") == 0, "loaded on the worker whose node has the files"
