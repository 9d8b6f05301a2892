"""Chunks straight from the workers on this machine, beside the inbox: the front door's lane.

Through Redis a chunk takes two hops to the request that waits for it (the worker's append to Redis,
then Redis to this front door's blocked XREAD of its inbox), each the wake-up of a process that may
sit idle; a socket between the two processes is one. Measured one request at a time, alternating
request by request on one stack: from the worker's hands to the request's 0.85 / 0.95 ms through
Redis, 0.46 / 0.58 ms over the lane; and this process and Redis spend less CPU per request at every
load (`bench/README.md`, path_overhead's section).

So the front door also listens on a Unix socket, in a folder that only its user can open (made by
`tempfile.mkdtemp`, mode 0700), and advertises the socket with a random token beside its heartbeat
(`keys.router_lane`, `switchboard.chunk_lane.LaneAddress`). A worker on the same machine, run by
the same user, connects, says the token, and sends its chunks here, each batch just before the
batch's appends to Redis (`workers.jobs.lane`); those appends then leave out the inbox copies. Nothing else changes: the result
stream is still the record, written all the same; each chunk is judged by its entry id
(`ResultReader.deliver_copy`), whichever way it came; a chunk that did not come here (a worker on
another machine, a lane that is down or behind) comes through the inbox, or a read of its stream.

A connection that does not say the token first, or sends what no worker sends, is closed.

Off by default (`router.chunk_lane`): a chunk reaches the client before Redis has it, and one that
Redis then loses is missing from the record a takeover answers from (README, "How a request travels").
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import msgspec

from switchboard.chunk_lane import CHUNK, HELLO, BadFrame, Frame, FrameReader, LaneAddress

logger = logging.getLogger(__name__)

# (result stream key, entry id, encoded chunk, the model that serves the job or None) → whether the
# job's stream must be read now (`ResultReader.deliver_copy`)
Deliver = Callable[[bytes, bytes, bytes, bytes | None], bool]
Take = Callable[[bytes, bytes, bytes, bytes | None], None]


class ChunkLane:
    """This front door's socket for chunks from the workers on its machine."""

    def __init__(self, deliver: Deliver, wake_reader: Callable[[], Awaitable[None]]) -> None:
        """`wake_reader` makes the result reader's blocked read return (`ResultReader.wake`): a copy
        that left out entries has its stream read at once, not once the read times out."""
        self._deliver = deliver
        self._wake_reader = wake_reader
        self._waking: asyncio.Task[None] | None = None
        self._token = secrets.token_hex(16)
        self._folder: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Transport] = set()

    async def open(self) -> None:
        """Listen on a new socket in a folder of this user's alone (mode 0700)."""
        # Named as the worker's runtime folders are: a worker of this user removes it once this
        # process is gone (`workers.runtime.private_runtime`).
        self._folder = Path(tempfile.mkdtemp(prefix=f"switchboard-{os.getpid()}-lane-"))
        path = self._folder / "lane.sock"
        self._server = await asyncio.get_running_loop().create_unix_server(
            lambda: _Connection(self._token.encode(), self._take, self._connections), str(path)
        )

    def _take(self, stream_key: bytes, entry_id: bytes, chunk: bytes, served_by: bytes | None) -> None:
        if self._deliver(stream_key, entry_id, chunk, served_by) and self._waking is None:
            self._waking = asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        try:
            await self._wake_reader()
        except Exception as exc:  # the read times out soon anyway, and reads the stream then
            logger.warning("could not wake the result reader", extra={"error": str(exc)})
        finally:
            self._waking = None

    @property
    def address(self) -> bytes | None:
        """What workers read from `keys.router_lane` (None before `open`)."""
        if self._folder is None:
            return None
        return msgspec.json.encode(LaneAddress(path=str(self._folder / "lane.sock"), token=self._token))

    async def close(self) -> None:
        """Stop listening, close every connection and remove the folder."""
        if self._waking is not None:
            self._waking.cancel()
        if self._server is not None:
            self._server.close()
            for transport in list(self._connections):
                transport.close()
            await self._server.wait_closed()
            self._server = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class _Connection(asyncio.Protocol):
    """One worker's connection: its token first, then its chunks."""

    def __init__(self, token: bytes, take: Take, connections: set[asyncio.Transport]) -> None:
        self._token = token
        self._take_chunk = take
        self._connections = connections
        self._frames = FrameReader()
        self._greeted = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport's subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        self._connections.add(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._connections.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        try:
            for frame in self._frames.feed(data):
                self._take(frame)
        except Exception as exc:  # a frame no worker sends: this connection is not a worker's
            logger.warning("closed a connection to the chunk lane", extra={"error": str(exc)})
            assert self._transport is not None
            self._transport.abort()

    def _take(self, frame: Frame) -> None:
        if not self._greeted:
            if frame.kind != HELLO or not hmac.compare_digest(frame.body, self._token):
                raise BadFrame("a connection that did not say the lane's token")
            self._greeted = True
        elif frame.kind == CHUNK:
            self._take_chunk(frame.stream_key, frame.entry_id, frame.body, frame.model or None)
        else:
            raise BadFrame("a second greeting")
