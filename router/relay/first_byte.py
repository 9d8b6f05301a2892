"""A streamed response's first byte: headers wait for the first chunk, then keep-alives; its framing.

Anything known before the first token (a failed load, a prompt too long, a deadline) should be a
real HTTP status with OpenAI's error object, not an error event inside a 200. So the headers wait
for the first chunk, up to `router.first_byte_budget_s`; a warm model's first chunk comes in
milliseconds, and nothing is read from Redis meanwhile. Past the budget (a model loading, a long
queue) the headers go out, and until the first chunk a keep-alive goes out every
`router.load_progress_every_s`, so that proxies and clients see the request alive.

By default the stream is byte for byte in OpenAI's shape (`data: <json>\n\n` events, then
`data: [DONE]\n\n`), and the keep-alive is one bare newline: a blank line, which the SSE standard,
EventSource and the `openai` SDK skip. Nothing else is safe for every stock parser: `vllm bench
serve` strips every network read and keeps whatever does not start with `data: ` in its buffer
until a blank line arrives inside one read, so a comment that came alone in a read glued itself to
the events after it and the whole answer was lost (tests/router/relay/test_sse_framing.py feeds a
real stream to it split at every byte).

A client that asks for a resumable stream (`router.intake.resume.wants_event_ids`) speaks SSE in
full: every event carries an `id:` line, `<job id>:<result stream entry id>` of the chunk it came
from, and the keep-alive is a comment telling where the model stands (`: loading tiny, 12 s of
about 50 s`). Either client can resume (`router.intake.resume`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream
from redis.exceptions import RedisError

from router.openai.errors import OpenAIError
from router.queue.chunk_source import ChunkSource
from router.relay.sse import Relay, error_for, sse_comment
from router.status.model_status import ModelStatus, ModelStatusReader
from switchboard.config import FrontDoorConfig
from switchboard.wire import Chunk

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Progress comments of the requests waiting on one model share a status read this recent.
STATUS_MAX_AGE_S = 1.0


# The keep-alive of a stream in OpenAI's shape: a blank line, which dispatches no event.
BLANK_LINE = b"\n"


class StreamForm(msgspec.Struct, frozen=True, kw_only=True):
    """How a stream is framed for its client: `event_ids` (full SSE: `id:` lines and progress
    comments) or OpenAI's shape, less the first `skip` events (a client that counted them resumes)."""

    event_ids: bool = False
    skip: int = 0


OPENAI_SHAPE = StreamForm()


async def stream_response(
    run: ChunkSource,
    relay: Relay,
    settings: FrontDoorConfig,
    status: ModelStatusReader,
    form: StreamForm = OPENAI_SHAPE,
) -> Stream:
    """The streamed response of `run`, once its first chunk came or the first-byte budget passed.

    Raises (as a real HTTP status) an error known before the first chunk, or within the budget.
    """
    run.mark_resumable()
    try:
        first = await run.wait_chunk(settings.first_byte_budget_s)
        relay.model = run.served_model
        if first is not None and first.error is not None:
            raise error_for(first.error, run.job.model)
    except BaseException:
        await run.close()
        raise
    events = _events(run, relay, first, settings.load_progress_every_s, status, form)
    # The background close covers a client that left before the body began (the events' own
    # `finally` never runs then); closing is idempotent.
    return Stream(
        events,
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        background=BackgroundTask(run.close),
    )


async def _events(
    run: ChunkSource,
    relay: Relay,
    first: Chunk | None,
    every_s: float,
    status: ModelStatusReader,
    form: StreamForm,
) -> AsyncIterator[bytes]:
    to_skip = form.skip
    # Events of chunks taken but not written yet (the next chunk was here already).
    pending: list[bytes] = []
    try:
        # A resumed stream whose client had the last event (`run.ended`) gets only the stream's end.
        while first is None and not run.ended:
            yield await _progress_comment(run.job.model, status) if form.event_ids else BLANK_LINE
            first = await run.wait_chunk(every_s)
        relay.model = run.served_model
        # One write for the chunks that are here: their events (and, after the last, the stream's
        # end) go out together, each a send through the ASGI layers and a system call less. A
        # chunk that is not here yet is not waited for: what is here goes out first.
        end = relay.stream_end
        async for chunk in run.chunks(first):
            events = relay.chunk_events(chunk)
            if chunk.is_last and end:
                events.append(end)
            pending.append(_framed(events, run, form, to_skip, end))
            to_skip = max(0, to_skip - sum(event != end for event in events))
            if chunk.is_last or not run.chunk_waiting:
                if written := b"".join(pending):
                    yield written
                pending = []
            if chunk.is_last:
                return
        if end:
            yield _framed([end], run, form, 0, end)
    except OpenAIError as exc:
        # Headers are gone by now: the error travels as an event, as OpenAI's streams do.
        # (After the events taken before it: results found lost were "here" like a chunk.)
        error = relay.error_event(exc)
        yield b"".join(pending) + (event_id(run) + error if form.event_ids else error)
    finally:
        await run.close()


def _framed(events: list[bytes], run: ChunkSource, form: StreamForm, to_skip: int, end: bytes) -> bytes:
    """`events` of the chunk `run` handed out last, as bytes to write: the first `to_skip` left out (the
    client had them before it resumed: it counted events; the stream's `end` is never left out), each
    with its `id:` line for a client that asked for them."""
    kept = [event for index, event in enumerate(events) if index >= to_skip or event == end]
    if form.event_ids:
        prefix = event_id(run)
        return b"".join(prefix + event for event in kept)
    return b"".join(kept)


def event_id(run: ChunkSource) -> bytes:
    """The SSE `id:` line of an event relayed from the chunk that `run` handed out last."""
    return f"id: {run.job.id}:{run.last_entry_id}\n".encode()


async def _progress_comment(model: str, status: ModelStatusReader) -> bytes:
    try:
        return sse_comment(describe_wait(await status.read_shared(model, STATUS_MAX_AGE_S)))
    except RedisError:
        logger.warning("could not read the model's status for a progress comment", extra={"model": model})
        return sse_comment(f"waiting for {model}")


def describe_wait(status: ModelStatus) -> str:
    """What a request waiting for its first chunk of `status.name` is waiting for, in a few words."""
    name = status.name
    queued = _jobs(status.waiting, "queued")
    if status.state == "warm":  # the queue is the story, even while another replica loads
        return f"waiting for {name} ({queued}, {status.in_flight} running)"
    loading = [r for r in status.replicas if r.state == "loading"]
    if loading:
        replica = max(loading, key=lambda r: r.loading_elapsed_s or 0.0)
        elapsed = f"{replica.loading_elapsed_s or 0.0:.0f} s"
        expected = "?" if replica.loading_expected_s is None else f"{replica.loading_expected_s:.0f} s"
        download = replica.download
        if download is not None:
            left = "" if download.eta_s is None else f", about {download.eta_s:.0f} s left"
            fetched = f"{download.bytes_done / 1e6:.0f} of {download.bytes_total / 1e6:.0f} MB"
            return f"loading {name}, {elapsed}: fetching its files ({fetched}{left})"
        return f"loading {name}, {elapsed} of about {expected}"
    if status.state == "sleeping":
        return f"waiting for {name} to wake ({queued})"
    if status.state == "unloading":
        return f"waiting for {name}, which is being unloaded ({queued})"
    if status.failure is not None:
        return (
            f"{name} failed to load: {status.failure.reason}; "
            f"retrying in {status.failure.retry_in_s:.0f} s ({queued})"
        )
    return f"waiting for a worker to load {name} ({queued})"


def _jobs(count: int, what: str) -> str:
    return f"{count} job{'' if count == 1 else 's'} {what}"
