"""One Triton model's requests on one long-lived gRPC stream: the consumer's outbox, carried until the
stream ends, and how a client ends it.

Shared by the clients of both kinds of Triton model (`workers.triton.generator.client`,
`workers.triton.pooling.client`): each puts its requests in an outbox and hands the responses it
gets back to its own jobs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tritonclient.grpc import service_pb2

from workers.triton.grpc_stream import GrpcCallError, GrpcStream, open_stream

logger = logging.getLogger(__name__)

# The bidirectional streaming call of Triton's gRPC service.
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"

# How long a closing client waits for Triton to end its stream (every request on it answered) before
# it cancels the stream; see `end_stream`.
CLOSE_GRACE_S = 1.0
# The outbox's last item: the stream's requests end there (gRPC's half-close).
END_OF_REQUESTS = None

Outbox = asyncio.Queue[service_pb2.ModelInferRequest | None]


class TritonStreamError(RuntimeError):
    """Triton refused a job, or the stream that carried it ended."""


async def end_stream(reader: asyncio.Task[None], outbox: Outbox, grace_s: float = CLOSE_GRACE_S) -> None:
    """End the stream that `reader` carries (`carry_stream`): its requests end (a half-close), and
    Triton ends the stream once it has answered every request on it; one still running after
    `grace_s` is cancelled with the stream.

    Not a cancel at once: a request whose final response Triton has just sent is still in flight
    in Triton for a few milliseconds (its backend has not released it yet). Cancelling the stream
    then left Triton waiting, forever, for that request to acknowledge the cancel, and the model
    could never be unloaded (Triton waits for every request of a model before it unloads it).
    """
    outbox.put_nowait(END_OF_REQUESTS)
    await asyncio.wait({reader}, timeout=grace_s)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


async def carry_stream(
    address: str,
    outbox: Outbox,
    model_name: str,
    on_response: Callable[[service_pb2.ModelStreamInferResponse], None],
) -> TritonStreamError:
    """Send `outbox`'s requests on one bidirectional gRPC stream to Triton at `address` (its gRPC
    target, `unix:<path>`), handing every response to `on_response`, until the stream ends
    (`END_OF_REQUESTS` in the outbox ends it once every request is answered); returns the error that
    the requests still waiting on it end with. A cancel (the client closing) is raised."""
    stream: GrpcStream | None = None
    sending: asyncio.Task[None] | None = None
    try:
        stream = await open_stream(address.removeprefix("unix:"), MODEL_STREAM_INFER)
        sending = asyncio.create_task(_send_all(stream, outbox))
        while (message := await stream.read()) is not None:
            on_response(service_pb2.ModelStreamInferResponse.FromString(message))
        return TritonStreamError(f"Triton ended the stream of {model_name}")
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        logger.warning("the Triton stream ended", extra={"model": model_name}, exc_info=True)
        return TritonStreamError(f"the Triton stream of {model_name} failed: {exc}")
    finally:
        if sending is not None:
            sending.cancel()
        if stream is not None:
            stream.close()


async def _send_all(stream: GrpcStream, outbox: Outbox) -> None:
    """Send the outbox's requests as they come, all that are waiting in one write; half-close at
    `END_OF_REQUESTS`."""
    while True:
        request = await outbox.get()
        try:
            while request is not END_OF_REQUESTS:
                stream.send(request.SerializeToString())
                if outbox.empty():
                    break
                request = outbox.get_nowait()
        except GrpcCallError:
            return  # the call has ended: its reader tells the requests why
        if request is END_OF_REQUESTS:
            stream.end()
            return
