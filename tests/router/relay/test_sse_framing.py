"""A real streamed response, read the way stock clients read it: split and merged across network reads
at every byte boundary (and at every pair of boundaries for a short one).

Two parsers, taken as they are:

- `vllm bench serve`'s, in vllm/benchmarks/lib/endpoint_request_func.py of the installed `vllm`:
  its own request functions (`async_request_openai_chat_completions`, `..._completions`) run over
  the reads (an aiohttp session stand-in hands them over, as `response.content.iter_any()` would).
  It strips every read, then splits its buffer on blank lines, or takes the buffer whole when it
  starts with `data: ` and parses as JSON: whatever else stays in the buffer is glued to the reads
  after it. So an `id:` line breaks every event, and a comment that comes alone in a read (a
  keep-alive during a long load) swallows the rest of the answer; a blank line is stripped away.
- the `openai` SDK's SSE decoder (`openai._streaming.SSEDecoder`), which LangChain and LiteLLM use
  too, and which follows the SSE standard as browsers' EventSource does.

The module is loaded from its file, without importing the `vllm` package (which imports torch).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import pytest
import redis.asyncio as aioredis
from openai._streaming import SSEDecoder

from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Usage
from tests.support.front_door_harness import BODY, MODEL, next_job, serving, settings_for, write_chunks

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESUMABLE = {"X-Switchboard-Resumable": "1"}
WORDS = ["Hello", ", world", " – ünïcödé ", "!"]


def _bench_module() -> ModuleType:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vllm is installed"
    path = Path(spec.submodule_search_locations[0]) / "benchmarks" / "lib" / "endpoint_request_func.py"
    module_spec = importlib.util.spec_from_file_location("vllm_bench_endpoint_request_func", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # its dataclasses look their module up
    module_spec.loader.exec_module(module)
    return module


bench = _bench_module()


# --- the reads ----------------------------------------------------------------------------------


def splits(stream: bytes) -> Iterator[list[bytes]]:
    """The stream as two reads, cut at every byte boundary (the whole stream as one read first)."""
    yield [stream]
    for cut in range(1, len(stream)):
        yield [stream[:cut], stream[cut:]]


def double_splits(stream: bytes) -> Iterator[list[bytes]]:
    """The stream as three reads, cut at every pair of byte boundaries."""
    for first in range(1, len(stream)):
        for second in range(first + 1, len(stream)):
            yield [stream[:first], stream[first:second], stream[second:]]


def at_a_space(reads: list[bytes]) -> bool:
    """Whether a read begins or ends with a space inside an event. The bench parser strips every
    read, so it loses such a space whatever the server (OpenAI's `data: ` has one): not framing."""
    return any(read[:1] == b" " or read[-1:] == b" " for read in reads)


# --- the parsers --------------------------------------------------------------------------------


def sdk_events(reads: Iterable[bytes]) -> list[str]:
    """The `data` of every event the openai SDK's decoder finds."""
    return [event.data for event in SSEDecoder().iter_bytes(iter(reads))]


class _Content:
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    async def iter_any(self) -> AsyncIterator[bytes]:
        for read in self._reads:
            yield read


class _Response:
    status = 200
    reason = "OK"

    def __init__(self, reads: list[bytes]) -> None:
        self.content = _Content(reads)

    async def __aenter__(self) -> _Response:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        return None


class _Session:
    """What the bench's request functions use of an aiohttp session: `post`, answering `reads`."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []

    def post(self, **_: Any) -> _Response:
        return _Response(self.reads)


async def bench_reads(path: str, reads_of: Iterable[list[bytes]]) -> list[tuple[bool, str, int, int]]:
    """(success, generated text, output tokens, token events) of the bench's request function over
    each way of reading the stream."""
    function = (
        bench.async_request_openai_chat_completions
        if path == CHAT
        else bench.async_request_openai_completions
    )
    session = _Session()
    request = bench.RequestFuncInput(
        prompt="Hi", api_url=f"http://front-door{path}", prompt_len=1, output_len=8, model=MODEL
    )
    found = []
    for reads in reads_of:
        session.reads = reads
        output = await function(request, session)
        found.append((output.success, output.generated_text, output.output_tokens, len(output.itl) + 1))
    return found


# --- a real response ----------------------------------------------------------------------------


def body_of(path: str) -> dict[str, Any]:
    streamed = {"stream": True, "stream_options": {"include_usage": True}}
    if path == CHAT:
        return {**BODY, **streamed}
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 8, **streamed}


async def streamed_bytes(
    redis_server: PrivateRedis,
    redis: aioredis.Redis,
    path: str,
    words: list[str],
    headers: dict[str, str] | None = None,
) -> bytes:
    """The body of a real streamed response, byte for byte, whose first chunk came after a few
    keep-alives (its model was slow to start)."""
    settings = settings_for(redis_server.url, first_byte_budget_s=0.05, load_progress_every_s=0.05)
    async with (
        serving(settings) as client,
        client.stream("POST", path, json=body_of(path), headers=headers) as response,
    ):
        assert response.status_code == 200
        job = await next_job(redis)
        await asyncio.sleep(0.25)
        *first, last = words
        usage = Usage(prompt_tokens=1, completion_tokens=len(words))
        chunks = [Chunk(text=word) for word in first]
        await write_chunks(redis, job.id, *chunks, Chunk(text=last, finish_reason="stop", usage=usage))
        return b"".join([raw async for raw in response.aiter_raw()])


def data_of(stream: bytes) -> list[str]:
    """The `data` of each event, read as the standard says, from the whole stream at once."""
    return [line.removeprefix("data: ") for line in stream.decode().split("\n") if line.startswith("data: ")]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_every_split_of_a_stream_with_keep_alives_reads_the_same_in_stock_parsers(
    redis: aioredis.Redis, redis_server: PrivateRedis, path: str
) -> None:
    stream = await streamed_bytes(redis_server, redis, path, WORDS)
    # OpenAI's shape: blank-line keep-alives, then `data:` events only.
    keep_alives = len(stream) - len(stream.lstrip(b"\n"))
    assert keep_alives >= 2, stream[:200]
    events = stream.lstrip(b"\n").split(b"\n\n")
    assert events[-1] == b"" and all(e.startswith(b"data: ") and b"\n" not in e for e in events[:-1])
    expected = data_of(stream)
    assert expected[-1] == "[DONE]" and len(expected) == len(WORDS) + 2  # the words, usage, [DONE]

    every_split = list(splits(stream))
    assert all(sdk_events(reads) == expected for reads in every_split)

    whole = (True, "".join(WORDS), len(WORDS), len(WORDS))
    kept = [reads for reads in every_split if not at_a_space(reads)]
    assert len(kept) > len(every_split) - 8 * len(expected)
    read_by_bench = await bench_reads(path, kept)
    assert read_by_bench == [whole] * len(kept)


async def test_every_pair_of_splits_of_a_short_stream_reads_the_same_in_stock_parsers(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    stream = await streamed_bytes(redis_server, redis, COMPLETIONS, ["Hi"])
    # The short stream: its keep-alives, its one text event and [DONE] (its usage event left out).
    text_event, _usage, done = stream.lstrip(b"\n").split(b"\n\n")[:3]
    short = b"\n\n\n" + text_event + b"\n\n" + done + b"\n\n"
    expected = data_of(short)
    pairs = list(double_splits(short))
    assert all(sdk_events(reads) == expected for reads in pairs)
    handled = [bench_messages(reads) for reads in pairs if not at_a_space(reads)]
    assert handled == [expected] * len(handled)


def bench_messages(reads: list[bytes]) -> list[str]:
    """The `data` of each event `vllm bench serve` takes from `reads`: its own buffer
    (`StreamedResponseHandler`) under the loop of its request functions, which strips each read,
    skips empty ones, skips messages that begin with ":" and removes `data: ` from the others."""
    handler = bench.StreamedResponseHandler()
    found = []
    for read in reads:
        read = read.strip()
        if not read:
            continue
        for message in handler.add_chunk(read):
            if not message.startswith(":"):
                data = message.removeprefix("data: ")
                if data != "[DONE]":
                    json.loads(data)  # what the bench does with it: a failure fails the request
                found.append(data)
    return found


# --- why ids and comments go only to clients that ask ------------------------------------------


async def test_the_resumable_form_is_what_the_bench_parser_cannot_read(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    stream = await streamed_bytes(redis_server, redis, CHAT, WORDS, headers=RESUMABLE)
    blocks = [block for block in stream.split(b"\n\n") if block]
    comments = [block for block in blocks if block.startswith(b": ")]
    assert comments and all(block.startswith(b"id: ") for block in blocks[len(comments) :])
    # The SDK reads it: it skips comments and keeps ids.
    assert sdk_events([stream]) == data_of(stream)
    # The bench does not: an `id:` line fails every event, even in one read...
    ((success, _, _, _),) = await bench_reads(CHAT, [[stream]])
    assert not success
    # ...and a comment alone in a read hides every event after it, even with no `id:` lines, when
    # each event comes in a read of its own (as the server writes them).
    one_per_read = [drop_id_line(block) + b"\n\n" for block in blocks]
    ((success, text, _, _),) = await bench_reads(CHAT, [one_per_read])
    assert (success, text) == (False, "")
    assert sdk_events(one_per_read) == data_of(stream)


def drop_id_line(block: bytes) -> bytes:
    return block.split(b"\n", 1)[1] if block.startswith(b"id: ") else block


# --- the bench's own request, over a real socket --------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_the_bench_request_reads_a_stream_whose_model_was_slow_to_start(
    redis: aioredis.Redis, redis_server: PrivateRedis, path: str
) -> None:
    """`vllm bench serve`'s request function, with its own aiohttp session, against the front door:
    the first token comes after several keep-alives, each written (and so read) on its own."""
    import aiohttp

    settings = settings_for(redis_server.url, first_byte_budget_s=0.05, load_progress_every_s=0.05)
    async with serving(settings) as client, aiohttp.ClientSession() as session:
        request = bench.RequestFuncInput(
            prompt="Hi",
            api_url=f"{client.base_url}{path}",
            prompt_len=1,
            output_len=8,
            model=MODEL,
            request_id="benchmark-serving-0",
        )
        call = asyncio.create_task(
            (
                bench.async_request_openai_chat_completions
                if path == CHAT
                else bench.async_request_openai_completions
            )(request, session)
        )
        job = await next_job(redis)
        await asyncio.sleep(0.3)
        usage = Usage(prompt_tokens=1, completion_tokens=len(WORDS))
        for word in WORDS[:-1]:
            await write_chunks(redis, job.id, Chunk(text=word))
            await asyncio.sleep(0.01)
        await write_chunks(redis, job.id, Chunk(text=WORDS[-1], finish_reason="stop", usage=usage))
        output = await call
    assert output.success, output.error
    assert (output.generated_text, output.output_tokens) == ("".join(WORDS), len(WORDS))
    assert len(output.itl) == len(WORDS) - 1 and output.ttft >= 0.3
