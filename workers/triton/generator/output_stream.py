"""Every job's chunks of one Triton model on one long-lived decoupled request: the model's output stream.

Each job still goes through Triton as a request of its own, and that request lasts as long as the
job runs; but its chunks do not come back as its responses. A Triton response costs about half a
millisecond of CPU across the worker's PyTriton threads, Triton's Python stub (a thread-pool hop
per response), tritonserver and the worker's gRPC reader, whatever it carries. So the chunks of all
of a model's jobs are posted here, and one listener takes them, many jobs' chunks at a time: in the
worker, the consumer's client in the same process (`GeneratorModel.open_local_output`, no Triton
response at all); for a client elsewhere, one request it opens with the stream (`OPEN_OUTPUT`),
many jobs' chunks per response. Each gRPC stream the client
opens has an output stream of its own (`STREAM_PARAMETER` on every request), and a newer one ends
the older ones: chunks of a new stream's jobs can never leave on a request that nobody reads.

The pacing rule is the coalescer's, one level up: a chunk that arrives after a quiet spell leaves at
once, and so do a job's first chunk and its last (time to first token and to the end are never
held); while chunks keep coming, at most one response leaves per `gap_s`, carrying all of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec

from workers.triton.generator.wakeup import Wakeup

logger = logging.getLogger(__name__)

# The job input that opens a model's output stream instead of running a job.
OPEN_OUTPUT = b""
# The job input that ends the output stream of the request's gRPC stream (a client elsewhere is
# closing): its request ends, answered, so that the client's stream can end without a cancel.
CLOSE_OUTPUT = b"close"
# Chunks kept while no output stream listens (its client is reopening one); beyond, the oldest go.
MAX_UNSENT = 100_000


class Posted(msgspec.Struct, array_like=True, frozen=True):
    """One job's chunk on the output stream: the tag of the job's request, the encoded chunk, and
    whether it is the job's last."""

    tag: int
    chunk: bytes
    last: bool


posted_batch_encoder = msgspec.msgpack.Encoder()
posted_batch_decoder = msgspec.msgpack.Decoder(list[Posted])


class OutputStream:
    """The chunks of one model's jobs on their way to the request that carries them all.

    Posting costs an append; the listener is woken only when it has something to do (the first
    chunk after a quiet spell, an urgent chunk, or the end of its gap).
    """

    def __init__(self, gap_s: float) -> None:
        self._gap_s = gap_s
        self._unsent: list[Posted] = []
        self._urgent = False
        self._wakeup = Wakeup()
        self._closed = False

    def post(self, tag: int, chunk: bytes, *, last: bool, urgent: bool) -> None:
        """Hand over a job's chunk; `urgent` ones (a job's first and last) never wait for the gap."""
        if self._closed:
            return  # nobody will read it: the job's client has failed it already
        self._unsent.append(Posted(tag, chunk, last))
        if len(self._unsent) > MAX_UNSENT:
            del self._unsent[: len(self._unsent) - MAX_UNSENT]
            logger.warning("no output stream took a model's chunks; the oldest were dropped")
        self._urgent = self._urgent or urgent or last
        self._wakeup.wake(urgent=self._urgent)

    def close(self) -> None:
        """End the listener (the model is being unbound, or its client opened a newer stream): Triton
        waits for its request to end."""
        self._closed = True
        self._wakeup.wake(urgent=True)

    async def listen(self) -> AsyncIterator[list[Posted]]:
        """The batches of posted chunks, paced, until the stream is closed."""
        loop = asyncio.get_running_loop()
        last_sent = float("-inf")
        while not self._closed:
            if not self._unsent:
                await self._wakeup.wait(urgent_only=False, deadline=None)
                continue
            send_at = last_sent + self._gap_s
            if not self._urgent and loop.time() < send_at:
                await self._wakeup.wait(urgent_only=True, deadline=send_at)
                if self._closed:
                    return
            batch, self._unsent, self._urgent = self._unsent, [], False
            last_sent = loop.time()
            yield batch


class OutputStreams:
    """The output streams of one model, one per gRPC stream of its client; the newest wins."""

    def __init__(self, gap_s: float) -> None:
        self._gap_s = gap_s
        self._streams: dict[int, OutputStream] = {}
        self._newest = -1

    def of(self, stream: int) -> OutputStream:
        """The output stream of the client's stream `stream`; a newer one closes the older ones."""
        found = self._streams.get(stream)
        if found is not None:
            return found
        found = OutputStream(self._gap_s)
        if stream < self._newest:
            found.close()  # a late request of a stream already replaced: nobody reads its output
            return found
        self._newest = stream
        for older in list(self._streams):
            self._streams.pop(older).close()
        self._streams[stream] = found
        return found

    def end(self, stream: int) -> None:
        """End the output stream `stream` (its client is closing); one opened for it later is
        closed at once."""
        found = self._streams.pop(stream, None)
        if found is not None:
            found.close()
        self._newest = max(self._newest, stream + 1)

    def close(self) -> None:
        """End every listener: the model is being unbound."""
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        self._newest = 2**62  # nothing opened after this is read
