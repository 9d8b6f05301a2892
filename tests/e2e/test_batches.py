"""OpenAI's Batch API as its docs write the workflow (upload, create, poll, download), with the
official `openai` client against the real stack (front door, Redis, a worker's vLLM engine on the
demo model): every `custom_id` answered exactly once as the live request is answered, a line the
model cannot take in the error file, and a cancel that stops the lines not yet run."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

from tests.support.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

PROMPTS = [f"Tell me about the number {n}." for n in range(12)]


def chat_body(prompt: str, max_tokens: int = 8) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def line(custom_id: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def finished(client: openai.OpenAI, batch_id: str, timeout_s: float = 240) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status} after {timeout_s} s"
        time.sleep(0.25)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(text) for text in client.files.content(file_id).text.splitlines() if text]


def test_the_documented_workflow_answers_every_line_once_as_live(client: openai.OpenAI) -> None:
    rows = [line(f"q-{n}", chat_body(prompt)) for n, prompt in enumerate(PROMPTS)]
    rows.append(line("too-long", chat_body("Hi", max_tokens=100_000)))  # past the model's context
    uploaded = client.files.create(file=("requests.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly-eval"},
    )
    assert (batch.status, batch.metadata) == ("validating", {"job": "nightly-eval"})

    done = finished(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        13,
        12,
        1,
    )
    outputs = lines_of(client, done.output_file_id)
    assert [row["custom_id"] for row in outputs] == [f"q-{n}" for n in range(12)]  # each once, in order
    for n, row in enumerate(outputs):
        assert row["response"]["status_code"] == 200 and row["error"] is None
        live = client.chat.completions.create(**chat_body(PROMPTS[n]))  # type: ignore[arg-type]
        assert row["response"]["body"]["choices"][0]["message"]["content"] == live.choices[0].message.content
        assert row["response"]["body"]["usage"]["completion_tokens"] == live.usage.completion_tokens  # type: ignore[union-attr]
    (failed,) = lines_of(client, done.error_file_id)
    assert failed["custom_id"] == "too-long" and failed["response"]["status_code"] == 400
    assert failed["error"]["code"] == "context_length_exceeded"
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"  # type: ignore[arg-type]
    assert batch.id in [listed.id for listed in client.batches.list()]


def test_a_cancelled_batch_runs_no_more_lines(client: openai.OpenAI) -> None:
    rows = [line(f"c-{n}", chat_body(f"Story {n}.", max_tokens=200)) for n in range(40)]
    uploaded = client.files.create(file=("many.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).status == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = finished(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    answered = [row["custom_id"] for row in lines_of(client, done.output_file_id)]
    assert len(answered) == len(set(answered)) < 40
    time.sleep(1.0)
    assert client.batches.retrieve(batch.id).request_counts.completed == len(answered)  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError):  # an ended batch stays as it ended
        client.batches.cancel(batch.id)
    with pytest.raises(openai.BadRequestError):  # an output file is no batch's input
        client.batches.create(
            input_file_id=done.output_file_id,  # type: ignore[arg-type]
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )


def test_a_batch_of_an_unknown_file_is_a_404(client: openai.OpenAI, stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
