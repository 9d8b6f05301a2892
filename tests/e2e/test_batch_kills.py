"""A batch of 2,000 lines across two models, with the batch runner's front door and then a worker
killed mid-run: it completes, every `custom_id` exactly once.

Every part is real: a Redis, two worker processes each holding both models warm (the demo model and
a second version of it) on vLLM CPU engines, two front doors on that Redis, and the official
`openai` client. The front door whose runner holds the lease (`keys.batch_runner_lease()`: the
process is found as the one renewing it) is killed with SIGKILL once some lines have completed; the
other takes the lease once it expires (`LEASE_S`) and runs the lines not recorded as finished. Once
its own lines run, the worker holding the most of them is killed with SIGKILL (its Triton and
engines with it): when its heartbeat has expired the other worker takes them over, and the batch
cannot complete before they are answered. The batch is polled through the surviving front door
until it completes: its output holds every line once, each a chat completion with usage, and no line
failed. The phases' times are printed: `pytest -s` shows them.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from router.batches.runner import LEASE_S
from switchboard import keys
from switchboard.local.demo_model import config_entry
from switchboard.local.launcher import Component
from switchboard.wire import Job, job_decoder, worker_decoder
from tests.support.redis_senders import sender_of
from tests.support.stack import MODEL, SECOND_VERSION, STACK_TIMEOUT_S, Stack

pytestmark = pytest.mark.e2e

StartStack = Callable[..., contextlib.AbstractContextManager[Stack]]
MODELS = (MODEL, SECOND_VERSION)
LINES = 2000
MAX_TOKENS = 2
# Lines completed before the runner's front door is killed, and lines of the next runner's own
# completed before a worker is killed.
COMPLETED_BEFORE_KILL = 150
# A batch that completes no line for this long has stalled (each kill stops it for about 15 s).
STALL_S = 45.0
# Heartbeats and takeover checks every half second (as tests/e2e/conftest.py's FAST_TAKEOVER); the
# jobs of the killed front door still running are cancelled soon after its heartbeat expires.
ENV = {
    "SWITCHBOARD_WORKER__HEARTBEAT_S": "0.5",
    "SWITCHBOARD_WORKER__TAKEOVER_CHECK_S": "0.5",
    "SWITCHBOARD_WORKER__ORPHAN_GRACE_S": "0.5",
}
ENDED = ("completed", "failed", "expired", "cancelled")
TAKEN_OVER = "taking over a job of a dead worker"


def config(demo_model_dir: Path, second_version_dir: Path) -> dict[str, Any]:
    """Both models warm on both workers: batch lines neither load a model nor keep one warm, so the
    worker left must hold both already. The worker's slots as configured by default (64, half of
    them for batch lines)."""
    return {
        "worker": {"cpu_kvcache_gib": 0.25},
        "models": [
            config_entry(demo_model_dir, preload=True, min_replicas=2),
            config_entry(second_version_dir, name=SECOND_VERSION, preload=True, min_replicas=2),
        ],
    }


def chat_line(n: int) -> str:
    body = {
        "model": MODELS[n % 2],
        "messages": [{"role": "user", "content": f"Say something about {n}."}],
        "max_tokens": MAX_TOKENS,
    }
    return json.dumps(
        {"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


def custom_id_of(job: Job) -> str:
    assert job.messages is not None
    found = re.search(r"about (\d+)\.", str(job.messages[-1].content))
    assert found is not None, job.messages
    return f"line-{found.group(1)}"


def warm_replicas(base_url: str, model: str) -> int:
    with urllib.request.urlopen(f"{base_url}/admin/models/{model}", timeout=10) as response:
        status: dict[str, Any] = json.loads(response.read())
    return len([replica for replica in status["replicas"] if replica["state"] == "warm"])


def lease_holder(store: redis.Redis) -> str | None:
    holder = store.get(keys.batch_runner_lease())
    return None if holder is None else bytes(holder).decode()


def batch_jobs_taken(store: redis.Redis) -> dict[str, dict[bytes, Job]]:
    """The batch-tier jobs each worker has taken and not finished (by entry id), by worker id."""
    taken: dict[str, dict[bytes, Job]] = {}
    for model in MODELS:
        stream = keys.job_stream(model, "batch")
        with contextlib.suppress(redis.ResponseError):  # no consumer group yet
            for pending in store.xpending_range(stream, keys.JOB_GROUP, "-", "+", 1000):
                entry_id = pending["message_id"]
                for _, fields in store.xrange(stream, entry_id, entry_id):
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    taken.setdefault(pending["consumer"].decode(), {})[entry_id] = job
    return taken


def batch_streams(store: redis.Redis) -> str:
    """Where each model's batch lines stand: waiting in its stream, and taken by each worker."""
    taken = batch_jobs_taken(store)
    return "; ".join(
        f"{model}: {store.xlen(keys.job_stream(model, 'batch'))} entries in its batch stream, taken "
        + str({worker: len([j for j in jobs.values() if j.model == model]) for worker, jobs in taken.items()})
        for model in MODELS
    )


def worker_process(stack: Stack, store: redis.Redis, worker_id: str) -> Component:
    record = store.get(keys.worker_record(worker_id))
    assert record is not None, f"worker {worker_id} has no record"
    pid = worker_decoder.decode(record).pid
    return next(worker for worker in stack.workers if worker.process.pid == pid)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(text) for text in client.files.content(file_id).text.splitlines() if text]


class Progress:
    """Polls a batch through one front door; fails when no line completes for STALL_S."""

    def __init__(self, stack: Stack, store: redis.Redis, batch_id: str) -> None:
        self.stack, self.store, self.batch_id = stack, store, batch_id
        self.client: openai.OpenAI | None = None
        self.completed = -1
        self._moved_at = time.monotonic()

    def poll(self) -> Any:
        assert self.client is not None
        batch = self.client.batches.retrieve(self.batch_id)
        completed = batch.request_counts.completed if batch.request_counts is not None else 0
        if completed != self.completed:
            self.completed, self._moved_at = completed, time.monotonic()
        elif batch.status not in ENDED and time.monotonic() - self._moved_at > STALL_S:
            pytest.fail(
                f"the batch ({batch.status}) completed no line for {STALL_S:g} s, at {completed} of "
                f"{LINES}: {batch_streams(self.store)}; logs in {self.stack.log_dir}"
            )
        return batch

    def until(self, condition: Callable[[Any], bool], what: str, timeout_s: float = 300) -> Any:
        """Poll until `condition(batch)`; returns the batch."""

        def met() -> Any:
            batch = self.poll()
            return batch if condition(batch) else None

        return self.stack.wait_until(met, timeout_s=timeout_s, what=what, poll_s=0.1)


def test_a_batch_completes_every_line_once_through_a_front_door_and_a_worker_killed(
    start_stack: StartStack, demo_model_dir: Path, second_version_dir: Path
) -> None:
    began = time.monotonic()
    marks: dict[str, float] = {}

    def mark(what: str) -> None:
        marks[what] = time.monotonic() - began

    with start_stack(config(demo_model_dir, second_version_dir), workers=2, env=ENV) as stack:
        second = stack.spawn_front_door()  # while the models load
        front_doors = {stack.router.name: stack.base_url, second.component.name: second.base_url}
        mark("stack and both front doors ready")
        store = redis.Redis.from_url(stack.redis_url)
        stack.wait_until(
            lambda: all(warm_replicas(stack.base_url, model) == 2 for model in MODELS),
            timeout_s=STACK_TIMEOUT_S,
            what="both workers to hold both models",
            poll_s=0.25,
        )
        mark("both models warm on both workers")
        clients = {
            name: openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
            for name, url in front_doors.items()
        }
        rows = "\n".join(chat_line(n) for n in range(LINES)).encode()
        uploaded = clients[stack.router.name].files.create(file=("kills.jsonl", rows), purpose="batch")
        batch = clients[stack.router.name].batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        first_holder = stack.wait_until(lambda: lease_holder(store), timeout_s=30, what="a runner's lease")
        # The front door whose runner holds the lease: the one renewing it.
        runner = sender_of(
            stack.redis_url,
            [stack.router, second.component],
            lambda words: words[:2] == ["pexpire", keys.batch_runner_lease()],
        )
        assert lease_holder(store) == first_holder
        (survivor,) = [name for name in front_doors if name != runner.name]
        progress = Progress(stack, store, batch.id)
        progress.client = clients[survivor]
        progress.until(lambda _: progress.completed >= COMPLETED_BEFORE_KILL, "lines to complete")
        runner.kill()
        killed_door_at = progress.completed
        mark(f"{runner.name}, the runner's front door, killed at {killed_door_at} lines completed")

        holder = stack.wait_until(
            lambda: (h := lease_holder(store)) != first_holder and h,
            timeout_s=LEASE_S + 15,
            what=f"{survivor} to take the lease",
        )
        mark(f"{survivor} took the lease")
        progress.until(
            lambda _: progress.completed >= killed_door_at + COMPLETED_BEFORE_KILL,
            f"{survivor}'s lines to complete",
        )

        def taken_for_the_new_runner() -> dict[str, dict[bytes, Job]]:
            taken = {
                worker: {entry: job for entry, job in jobs.items() if job.router_id == holder}
                for worker, jobs in batch_jobs_taken(store).items()
            }
            return {worker: jobs for worker, jobs in taken.items() if jobs}

        taken = stack.wait_until(taken_for_the_new_runner, timeout_s=30, what="lines taken")
        victim_id, victim_jobs = max(taken.items(), key=lambda item: len(item[1]))
        victim = worker_process(stack, store, victim_id)
        (heir,) = [worker for worker in stack.workers if worker is not victim]
        victim.kill()
        assert progress.poll().status == "in_progress", "the premise: the batch still runs"
        mark(f"{victim.name} killed with {len(victim_jobs)} lines taken, at {progress.completed} completed")

        done = progress.until(lambda b: b.status in ENDED, "the batch to end")
        mark("batch ended")
        outputs = lines_of(progress.client, done.output_file_id)
        errors = lines_of(progress.client, done.error_file_id)
        for client in clients.values():
            client.close()
        store.close()
        assert heir.log_path is not None
        taken_over = {
            entry
            for entry in victim_jobs
            for line in heir.log_path.read_text(errors="replace").splitlines()
            if TAKEN_OVER in line and f"entry_id={entry.decode()}" in line
        }

    print(
        "\n"
        + "\n".join(f"{at:6.1f} s  {what}" for what, at in marks.items())
        + f"\nthe lease: {first_holder} ({runner.name}), then {holder} ({survivor}); "
        f"{len(taken_over)} of the killed worker's {len(victim_jobs)} lines taken over by {heir.name}"
    )
    assert done.status == "completed", done
    assert errors == [], errors[:5]
    ids = [row["custom_id"] for row in outputs]
    assert len(ids) == len(set(ids)) == LINES, f"{len(ids)} lines, {len(set(ids))} distinct"
    assert ids == [f"line-{n}" for n in range(LINES)], "each once, in the input's order"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        LINES,
        LINES,
        0,
    )
    for n, row in enumerate(outputs):
        response = row["response"]
        assert row["error"] is None and response["status_code"] == 200, row
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == MODELS[n % 2], body
        assert body["choices"][0]["message"]["role"] == "assistant", body
        usage = body["usage"]
        assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= MAX_TOKENS, row
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], row
    # The killed worker's lines of the running batch were taken over by the other worker, and
    # answered (the batch completed, each line once).
    assert taken_over, "none of the killed worker's lines was taken over"
    assert {custom_id_of(job) for job in victim_jobs.values()} <= set(ids)
