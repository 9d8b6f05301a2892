"""compose.yaml run for real, as local processes: redis, the router and two CPU workers.

No container engine runs here, so `LocalCompose` starts each service's own command with its own
environment from compose.yaml (`worker-cpu` scaled to two, as `--scale worker-cpu=2` would), the
demo model mounted where the compose config expects its models. The `openai` client then shows that
jobs are served by both workers, and that a worker stopped mid-load (SIGTERM, as `docker compose
stop` sends it) loses nothing: its running jobs finish, new ones go to the other worker, and it
exits within the grace period compose gives it.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import shutil
import string
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from openai import OpenAI
from openai.types.chat import ChatCompletion

from switchboard import keys
from switchboard.local.toml_text import toml_text
from switchboard.wire import load_failure_decoder, worker_decoder
from tests.support.deploy.compose_file import REPO, load_compose
from tests.support.deploy.compose_local import LocalCompose, Replica
from tests.support.deploy.product import reads_redis_url_file
from workers.jobs.takeover import decode_entry

pytestmark = pytest.mark.e2e

MODEL = "switchboard-demo"
WORKERS = 2
MAX_TOKENS = 96
# A busy 2-core machine took over two minutes to start one vLLM CPU engine.
STACK_TIMEOUT_S = 600.0

T = TypeVar("T")


def _wait(condition: Callable[[], T | None], what: str, stack: LocalCompose, timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        stack.check()
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:.0f} s for {what}; logs in {stack.root / 'logs'}")
        time.sleep(0.1)


class PendingWatcher:
    """Which worker took which job: the consumer (a worker id, `host-pid-xxxxxx`) of each pending entry.

    Jobs are acknowledged and deleted once finished, so the stream is polled while they run.
    """

    def __init__(self, client: redis.Redis, stream: str) -> None:
        self._client = client
        self._stream = stream
        self.takers: dict[str, list[int]] = {}  # job id → pids of the workers that took it, in order
        self._entries: dict[bytes, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def pending_on(self, pid: int) -> set[str]:
        """The jobs a worker holds right now."""
        pending = self._client.xpending_range(self._stream, keys.JOB_GROUP, min="-", max="+", count=10_000)
        return {self._job_id(p["message_id"]) for p in pending if _pid(p["consumer"]) == pid} - {""}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            pending = self._client.xpending_range(
                self._stream, keys.JOB_GROUP, min="-", max="+", count=10_000
            )
            for entry in pending:
                job_id = self._job_id(entry["message_id"])
                takers = self.takers.setdefault(job_id, [])
                pid = _pid(entry["consumer"])
                if job_id and (not takers or takers[-1] != pid):
                    takers.append(pid)

    def _job_id(self, entry_id: bytes) -> str:
        if entry_id not in self._entries:
            found = self._client.xrange(self._stream, min=entry_id, max=entry_id)
            if not found:
                return ""  # finished and deleted between the two reads
            self._entries[entry_id] = decode_entry(self._stream, entry_id, found[0][1]).job.id
        return self._entries[entry_id]


def _pid(consumer: bytes | str) -> int:
    name = consumer.decode() if isinstance(consumer, bytes) else consumer
    return int(name.rsplit("-", 2)[1])


def _warm_workers(client: redis.Redis) -> set[int]:
    """Pids of the live workers that hold the model warm, from their heartbeat records."""
    failure = client.get(keys.load_failure(MODEL))
    if failure is not None:
        pytest.fail(f"the model failed to load: {load_failure_decoder.decode(failure).reason}")
    warm = set()
    for worker_id in client.zrange(keys.workers_index(), 0, -1):
        raw = client.get(keys.worker_record(worker_id.decode()))
        if raw is not None:
            record = worker_decoder.decode(raw)
            if MODEL in record.models:
                warm.add(record.pid)
    return warm


def _ask(openai: OpenAI, number: int) -> ChatCompletion:
    return openai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Tell me a story, number {number}."}],
        max_tokens=MAX_TOKENS,
        extra_body={"min_tokens": MAX_TOKENS},  # the random model must not stop early
    )


def _complete(reply: ChatCompletion) -> str:
    """The job id of an answer that arrived whole: every token asked for, nothing missing."""
    (choice,) = reply.choices
    assert choice.finish_reason == "length" and choice.message.content
    assert reply.usage is not None and reply.usage.completion_tokens == MAX_TOKENS
    return reply.id.removeprefix("chatcmpl-")


def _compose_config(tmp_path: Path) -> Path:
    """deploy/compose/switchboard.toml, asking for the model on both workers (min_replicas), as a
    deployment scaled to two workers for one model would."""
    settings: dict[str, Any] = tomllib.loads((REPO / "deploy" / "compose" / "switchboard.toml").read_text())
    (model,) = [m for m in settings["models"] if m["name"] == MODEL]
    model["min_replicas"] = WORKERS
    path = tmp_path / "switchboard.toml"
    path.write_text(toml_text(settings))
    return path


def test_compose_services_serve_from_both_workers_and_a_stopped_worker_loses_nothing(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    if not reads_redis_url_file():
        pytest.skip(
            "the product does not read REDIS_URL_FILE yet: compose hands the Redis URL over as a file"
        )
    models = tmp_path / "models"
    models.mkdir()
    (models / MODEL).symlink_to(demo_model_dir)
    api_key = f"sb-{secrets.token_hex(16)}"
    password = "".join(random.choices(string.ascii_letters, k=24))
    env = {  # what .env would hold (deploy/compose/env.example)
        "COMPOSE_PROFILES": "cpu",
        "REDIS_PASSWORD": password,
        "REDIS_URL": f"redis://:{password}@redis:6379/0",
        "SWITCHBOARD_ADMIN_KEY_SHA256": hashlib.sha256(api_key.encode()).hexdigest(),
        "SWITCHBOARD_MODELS_DIR": str(models),
        "SWITCHBOARD_CONFIG": str(_compose_config(tmp_path)),
    }
    compose = load_compose(env)
    # A short root: the image's home is /home/switchboard, and PyTriton's sockets live under
    # ~/.cache, where a path past 107 characters is refused (AF_UNIX).
    root = Path(tempfile.mkdtemp(prefix="sb-compose-"))
    try:
        _serve_and_stop_one(compose, env, root, api_key)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _serve_and_stop_one(compose: dict[str, Any], env: dict[str, str], root: Path, api_key: str) -> None:
    services = ["redis", "router", "worker-cpu"]
    with LocalCompose(
        compose, root=root, services=services, scale={"worker-cpu": WORKERS}, environ=env
    ) as stack:
        stack.up(timeout_s=STACK_TIMEOUT_S)
        stack.wait_healthy("router", STACK_TIMEOUT_S)
        redis_url = f"redis://:{env['REDIS_PASSWORD']}@127.0.0.1:{stack.port('redis', 6379)}/0"
        client = redis.Redis.from_url(redis_url)
        workers: list[Replica] = stack.replicas["worker-cpu"]
        pids = {worker.pid for worker in workers}
        _wait(lambda: _warm_workers(client) == pids, "both workers to hold the model", stack, STACK_TIMEOUT_S)

        base_url = f"http://127.0.0.1:{stack.port('router', 8000)}/v1"
        watcher = PendingWatcher(client, keys.job_stream(MODEL))
        with (
            OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300) as openai,
            ThreadPoolExecutor(max_workers=24) as pool,
        ):
            # Jobs are served by both workers.
            replies = list(pool.map(lambda n: _ask(openai, n), range(16)))
            jobs = [_complete(reply) for reply in replies]
            served_by = {pid for job in jobs for pid in watcher.takers.get(job, [])}
            assert served_by == pids, f"jobs went to {served_by}, workers are {pids}"

            # A worker stopped mid-load: what it runs finishes, the rest goes to the other one.
            stopped, other = workers
            before: list[Future[ChatCompletion]] = [pool.submit(_ask, openai, n) for n in range(100, 116)]
            held = _wait(lambda: watcher.pending_on(stopped.pid), "the worker to hold jobs", stack, 120)
            stack.stop_replica(stopped)
            stopped_at = time.monotonic()
            # Jobs sent once it has stopped taking them (its next stop step has begun): on a busy
            # machine the signal may take a while to be handled, and until then it takes jobs as usual.
            _wait(
                lambda: "stopping: stop the model controller" in stopped.log(),
                "the stopped worker to stop taking jobs",
                stack,
                STACK_TIMEOUT_S,
            )
            after: list[Future[ChatCompletion]] = [pool.submit(_ask, openai, n) for n in range(200, 208)]
            jobs_before = [_complete(future.result()) for future in before]
            jobs_after = [_complete(future.result()) for future in after]
            watcher.stop()

        assert held <= set(jobs_before)
        # New jobs go to the other worker. The stopped one may still take a job in the moment
        # before its consumer stops reading (it stops its model controller first): that job is
        # finished in the drain, or handed back, and arrived whole above either way.
        late = {job: watcher.takers.get(job, []) for job in jobs_after}
        print(f"jobs sent after the stop, by the pids that took them: {late} (stopped {stopped.pid})")
        assert any(takers[-1:] == [other.pid] for takers in late.values()), late
        stopped.process.wait(stack.grace_s("worker-cpu"))
        exit_s = time.monotonic() - stopped_at
        assert stopped.process.returncode == 0, stopped.log()[-3000:]
        assert exit_s < stack.grace_s("worker-cpu")
        assert other.process.poll() is None
    assert stack.forced == [], f"ignored SIGTERM for their grace period: {stack.forced}"
