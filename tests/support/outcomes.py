"""One request's outcome as a client sees it, for the fault tests that audit every request they sent.

A request ends one way: `complete` (the whole answer, with its finish reason: for a stream, a last
choice with `finish_reason` and then `data: [DONE]`), `error` (OpenAI's error object with an HTTP
status, a 503 or 429 carrying Retry-After; or, once a stream's headers are out, an SSE error event
and then `[DONE]`), `left` (the client chose to leave early), or one of the failures the issue rules
out: `truncated` (a stream that ended with neither a finish reason nor an error event), `hung` (no
end within the test's bound), `broken` (the connection failed under the client), `bad_error` (an
error without OpenAI's shape, or a retryable status without Retry-After).

Streams are read with httpx, line by line, so the SSE `id:` lines are seen too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

GOOD = ("complete", "error", "left")
RETRYABLE = (429, 503)


@dataclass
class Outcome:
    """What one request got."""

    endpoint: str  # "chat" or "completions"
    stream: bool
    kind: str = "hung"
    status: int | None = None
    code: str | None = None  # the error's code, for kind == "error"
    text: str = ""
    finish: str | None = None
    completion_tokens: int | None = None
    event_ids: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    detail: str = ""

    @property
    def label(self) -> str:
        """`chat/stream`, `completions/plain`, ..."""
        return f"{self.endpoint}/{'stream' if self.stream else 'plain'}"

    @property
    def seconds(self) -> float:
        return self.ended - self.started


PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


async def call(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    *,
    bound_s: float,
    leave_after_s: float | None = None,
    headers: dict[str, str] | None = None,
    into: Outcome | None = None,
) -> Outcome:
    """Send one request and classify how it ended; never raises for what the server or network did.

    `into`: the outcome to fill in (a streamed one's text grows as it arrives, for a caller to watch).
    """
    stream = bool(body.get("stream"))
    outcome = into or Outcome(endpoint=endpoint, stream=stream)
    outcome.started = time.monotonic()
    limit = bound_s if leave_after_s is None else min(bound_s, leave_after_s)
    try:
        async with asyncio.timeout(limit):
            if stream:
                await _read_stream(client, endpoint, body, outcome, headers)
            else:
                await _read_plain(client, endpoint, body, outcome, headers)
    except TimeoutError:
        if leave_after_s is not None and leave_after_s < bound_s:
            outcome.kind = "left"
        else:
            outcome.kind, outcome.detail = "hung", f"no end within {bound_s:g} s"
    except httpx.HTTPError as exc:
        outcome.kind, outcome.detail = "broken", f"{type(exc).__name__}: {exc}"
    outcome.ended = time.monotonic()
    return outcome


async def _read_plain(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    outcome: Outcome,
    headers: dict[str, str] | None,
) -> None:
    response = await client.post(PATHS[endpoint], json=body, headers=headers)
    outcome.status = response.status_code
    if response.status_code != 200:
        _error_response(response.status_code, response.headers, response.content, outcome)
        return
    answer = response.json()
    choice = answer["choices"][0]
    outcome.text = (choice["message"]["content"] or "") if endpoint == "chat" else choice["text"]
    outcome.finish = choice.get("finish_reason")
    outcome.completion_tokens = answer["usage"]["completion_tokens"]
    outcome.kind = "complete" if outcome.finish else "truncated"


async def _read_stream(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    outcome: Outcome,
    headers: dict[str, str] | None,
) -> None:
    async with client.stream("POST", PATHS[endpoint], json=body, headers=headers) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            _error_response(response.status_code, response.headers, await response.aread(), outcome)
            return
        await read_events(response.aiter_lines(), outcome)


async def read_events(lines: Any, outcome: Outcome, *, count: int | None = None) -> None:
    """Read SSE lines into `outcome` until `[DONE]` (or `count` text events); sets its kind at the end."""
    done, error, texts = False, None, 0
    async for line in lines:
        if line.startswith("id: "):
            outcome.event_ids.append(line[len("id: ") :])
            continue
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            error = event["error"]
            continue
        if event.get("usage"):
            outcome.completion_tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", []):
            piece = choice["delta"].get("content") if outcome.endpoint == "chat" else choice.get("text")
            outcome.text += piece or ""
            texts += 1 if piece else 0
            outcome.finish = choice.get("finish_reason") or outcome.finish
        if count is not None and texts >= count:
            return
    if error is not None and done:
        outcome.kind, outcome.code = "error", error.get("code")
        outcome.detail = str(error.get("message"))[:200]
    elif outcome.finish and done:
        outcome.kind = "complete"
    else:
        outcome.kind = "truncated"
        outcome.detail = f"ended after {len(outcome.text)} characters, done={done}, error={error}"


def _error_response(status: int, headers: httpx.Headers, content: bytes, outcome: Outcome) -> None:
    try:
        error = json.loads(content)["error"]
        outcome.code = error.get("code")
        outcome.detail = str(error["message"])[:200]
        assert isinstance(error["type"], str)
    except (ValueError, KeyError, TypeError, AssertionError):
        outcome.kind, outcome.detail = "bad_error", f"{status}: {content[:200]!r}"
        return
    if status in RETRYABLE and "retry-after" not in headers:
        outcome.kind, outcome.detail = "bad_error", f"{status} {outcome.code} without Retry-After"
        return
    outcome.kind = "error"


def table(outcomes: list[Outcome]) -> str:
    """Outcomes counted by request kind and outcome (errors by status and code), as printed lines."""
    rows: Counter[tuple[str, str]] = Counter()
    for outcome in outcomes:
        what = outcome.kind
        if outcome.kind == "error":
            what = f"error {outcome.status} {outcome.code}"
        rows[(outcome.label, what)] += 1
    width = max([len(what) for _, what in rows] + [7])
    lines = [f"  {'request':<18} {'outcome':<{width}} {'count':>5}"]
    lines += [f"  {label:<18} {what:<{width}} {count:>5}" for (label, what), count in sorted(rows.items())]
    lines.append(f"  {'all':<18} {'':<{width}} {len(outcomes):>5}")
    return "\n".join(lines)


def failures(outcomes: list[Outcome]) -> list[str]:
    """The outcomes the issue rules out (hung, truncated, broken, bad_error), described."""
    return [f"{o.label} {o.kind} after {o.seconds:.1f} s: {o.detail}" for o in outcomes if o.kind not in GOOD]
