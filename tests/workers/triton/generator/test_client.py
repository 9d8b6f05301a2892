"""The job client against a real Triton host: many jobs on one gRPC stream, each gets its own chunks."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import socket
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import psutil
import pytest
import pytest_asyncio

from switchboard.config import ModelConfig, triton_model_name
from switchboard.wire import chunk_decoder, encode
from tests.support.jobs import make_job
from tests.support.scripted_engine import ScriptedEngine
from tests.support.waits import eventually
from workers.models.slot import ModelSlot
from workers.triton.generator.client import TritonJobClient
from workers.triton.generator.model import CoalescingPolicy, GeneratorModel
from workers.triton.host import TritonHost
from workers.triton.request_stream import TritonStreamError

# No coalescing: every token is its own response, so that the jobs' responses interleave.
NO_WAIT = CoalescingPolicy(min_window_s=0.0, max_window_s=0.0, max_chunks_per_s=1e6)

# One Triton for the module (starting and stopping one takes 5 s); each test binds its own model.
pytestmark = pytest.mark.asyncio(loop_scope="module")


# Every test runs against both ways a generator's Triton model reaches the engine's loop: the
# worker's own backend inside tritonserver, and a Python-backend stub (where it is not built).
BACKENDS = {"own backend": True, "Python stub": False}


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=list(BACKENDS))
async def host(request: pytest.FixtureRequest) -> AsyncIterator[TritonHost]:
    triton = TritonHost(coalescing=NO_WAIT, native=BACKENDS[request.param])
    await asyncio.to_thread(triton.start)
    try:
        yield triton
    finally:
        await asyncio.to_thread(triton.stop)


@pytest_asyncio.fixture(loop_scope="module")
async def slot(host: TritonHost) -> AsyncIterator[ModelSlot]:
    started = asyncio.Event()
    started.set()
    engine = ScriptedEngine()
    one = ModelSlot(
        ModelConfig(name="m", path="unused"),
        host=host,
        host_started=started,
        create_engine=lambda _: engine,
        read_barrier=lambda: asyncio.sleep(0),
        on_change=lambda: None,
    )
    await one.ensure_warm()
    try:
        yield one
    finally:
        await one.unload()


async def texts(client: TritonJobClient, prompt: str) -> list[str]:
    return [chunk_decoder.decode(raw).text async for raw in client.stream(encode(make_job("m", prompt)))]


@pytest.mark.parametrize("chunks", ["handed over in process", "as Triton responses"])
async def test_jobs_at_once_share_the_stream_and_each_gets_its_own_chunks(
    host: TritonHost, slot: ModelSlot, chunks: str
) -> None:
    """The worker's client (its slot's) takes its jobs' chunks from the model in process; a client
    that is given no model reads them from the output stream's request, as a remote one would."""
    lease = slot.lease()
    client = lease.served.client
    if chunks == "as Triton responses":
        client = TritonJobClient(host.grpc_address, triton_model_name("m"))
    try:
        counts = [3, 17, 1, 40, 8, 25]
        answers = await asyncio.gather(*(texts(client, f"slow {n} 0.002") for n in counts))
    finally:
        lease.release()
        if client is not lease.served.client:
            await client.close()
    for count, answer in zip(counts, answers, strict=True):
        assert "".join(answer) == "".join(f"t{i}\x00 " for i in range(count))
        assert len(answer) == count, "one chunk per token, in order, none lost or repeated"


async def test_jobs_and_chunks_larger_than_grpcs_default_message_limit_go_through(slot: ModelSlot) -> None:
    over_4_mib = 6 * 1024 * 1024
    big_job = msgspec.structs.replace(make_job("m", "fast 2"), tools="x" * over_4_mib)
    lease = slot.lease()
    try:
        sent = [chunk_decoder.decode(raw).text async for raw in lease.served.client.stream(encode(big_job))]
        received = await texts(lease.served.client, f"big {over_4_mib}")
    finally:
        lease.release()
    assert "".join(sent) == "t0\x00 t1\x00 "
    assert [len(text) for text in received] == [over_4_mib]


async def test_a_job_refused_by_triton_fails_alone(host: TritonHost, slot: ModelSlot) -> None:
    lease = slot.lease()
    try:
        served = lease.served.client
        # A client on the same server for a model it does not hold: Triton refuses its jobs.
        unknown = TritonJobClient(host.grpc_address, triton_model_name("not-bound"))
        with pytest.raises(TritonStreamError, match="unknown model"):
            await texts(unknown, "fast 2")
        # Its stream goes on serving the jobs after it.
        with pytest.raises(TritonStreamError, match="unknown model"):
            await texts(unknown, "fast 2")
        await unknown.close()
        assert len(await texts(served, "fast 2")) == 2
    finally:
        lease.release()


async def test_a_job_left_midway_does_not_disturb_the_others(slot: ModelSlot) -> None:
    lease = slot.lease()
    try:
        client = lease.served.client
        left = client.stream(encode(make_job("m", "slow 50 0.002")))
        assert await anext(left)
        await left.aclose()  # the rest of its responses arrive for nobody and are dropped
        answers = await asyncio.gather(*(texts(client, "slow 20 0.002") for _ in range(3)))
        assert [len(a) for a in answers] == [20, 20, 20]
    finally:
        lease.release()


async def test_a_closed_client_ends_the_jobs_still_waiting(host: TritonHost, slot: ModelSlot) -> None:
    client = TritonJobClient(host.grpc_address, triton_model_name("m"))
    hung = make_job("m", "queued")
    waiting = asyncio.ensure_future(anext(client.stream(encode(hung))))
    await asyncio.sleep(0.5)
    await client.close()
    with pytest.raises(TritonStreamError, match="closed"):
        await waiting
    with pytest.raises(TritonStreamError, match="closed"):
        await texts(client, "fast 1")
    await slot.abort(hung.id)  # still running in the engine, for nobody


async def test_a_model_unloads_after_clients_closed_as_their_jobs_ended(
    host: TritonHost, slot: ModelSlot
) -> None:
    """A job's last chunk comes in process before Triton has released the job's request. A client
    closed at that moment that cancelled its stream left Triton waiting for the request forever, and
    the model could never be unloaded (it failed the slot's next load after 30 s); a closing client
    ends its stream, and Triton ends it once every request is answered."""
    lease = slot.lease()
    try:
        model = lease.served.triton_model
        assert isinstance(model, GeneratorModel)
        for _ in range(100):
            # As the slot's own client: chunks in process (each newer client takes the output over).
            client = TritonJobClient(host.grpc_address, triton_model_name("m"), local=model)
            assert len(await texts(client, "fast 2")) == 2
            await asyncio.wait_for(client.close(), 5)
    finally:
        lease.release()
    await slot.unload()
    await slot.ensure_warm()  # waits for the unload (30 s at most)


async def test_a_model_being_unbound_ends_the_jobs_waiting_for_its_chunks_in_process(slot: ModelSlot) -> None:
    """Unbinding a model first ends its output streams (Triton waits for their requests): a job
    whose chunks would come in process ends with an error, as one on Triton's output request does."""
    lease = slot.lease()
    hung = make_job("m", "queued")
    try:
        client = lease.served.client
        assert len(await texts(client, "fast 2")) == 2
        waiting = asyncio.ensure_future(anext(client.stream(encode(hung))))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        lease.served.triton_model.end_output_streams()
        with pytest.raises(TritonStreamError, match=r"output stream of .* ended"):
            await asyncio.wait_for(waiting, 10)
    finally:
        lease.release()
        await slot.abort(hung.id)


async def test_a_stub_that_dies_fails_its_jobs_and_stops_their_work_in_the_engine(
    host: TritonHost, slot: ModelSlot
) -> None:
    """The model's Triton stub hands each request to the engine's loop; killed while a job runs (out
    of memory, say), the job fails rather than hang, its work in the engine stops, and the model
    serves the next job through the stub Triton starts in its place."""
    if host.native:
        pytest.skip("the worker's own backend runs inside tritonserver: there is no stub to die")
    lease = slot.lease()
    job = make_job("m", "slow 1000000 0.01")
    try:
        client, model = lease.served.client, lease.served.triton_model
        assert isinstance(model, GeneratorModel)

        async def ended_in_the_engine() -> bool:
            return job.id not in model._running

        stream = client.stream(encode(job))
        await anext(stream)
        _stub_of(triton_model_name("m")).kill()
        with pytest.raises(TritonStreamError):
            await asyncio.wait_for(_drain(stream), 10)
        await eventually(ended_in_the_engine)
        await eventually(_serves_again(client), timeout_s=30, what="a job through the new stub")
    finally:
        lease.release()


async def test_the_engine_loops_end_fails_the_jobs_it_had(host: TritonHost, slot: ModelSlot) -> None:
    """A job whose engine loop goes away (its socket closes under Triton's model) fails rather than
    hang: Triton's model ends its request, or the loop's end ends the output it was handed in process
    (whichever reaches the client first)."""
    lease = slot.lease()
    try:
        stream = lease.served.client.stream(encode(make_job("m", "slow 1000000 0.01")))
        await anext(stream)
        await asyncio.to_thread(host._job_sockets[triton_model_name("m")].close)
        with pytest.raises(
            TritonStreamError, match=r"engine loop ended while the job ran|output stream of m ended"
        ):
            await asyncio.wait_for(_drain(stream), 10)
    finally:
        lease.release()


async def test_the_own_backend_serves_inside_tritonserver_and_triton_counts_its_requests(
    host: TritonHost, slot: ModelSlot
) -> None:
    """On the worker's own backend no stub process runs for the model, and Triton's metrics count its
    requests as they count a Python model's."""
    if not host.native:
        pytest.skip("the Python backend's model runs in a stub")
    lease = slot.lease()
    try:
        for _ in range(3):
            assert len(await texts(lease.served.client, "fast 2")) == 2
    finally:
        lease.release()
    assert not _stubs_of(triton_model_name("m"))
    metrics = await asyncio.to_thread(_triton_metrics, host)
    found = re.search(
        rf'^nv_inference_request_success\{{model="{triton_model_name("m")}".*\}} (\d+)', metrics, re.M
    )
    assert found is not None and int(found.group(1)) >= 3, metrics


def _triton_metrics(host: TritonHost) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{host.metrics_port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


async def _drain(stream: AsyncIterator[bytes]) -> None:
    async for _ in stream:
        pass


def _stub_of(triton_model: str) -> psutil.Process:
    stubs = _stubs_of(triton_model)
    assert len(stubs) == 1, stubs
    return stubs[0]


def _stubs_of(triton_model: str) -> list[psutil.Process]:
    return [
        process
        for process in psutil.Process().children(recursive=True)
        if "triton_python_backend_stub" in " ".join(process.cmdline())
        and f"{triton_model}_0_0" in process.cmdline()
    ]


def _serves_again(client: TritonJobClient) -> Callable[[], Awaitable[bool]]:
    async def serves() -> bool:
        try:
            return len(await asyncio.wait_for(texts(client, "fast 2"), 5)) == 2
        except (TritonStreamError, TimeoutError):
            return False

    return serves


@pytest.mark.skipif(os.getuid() != 0, reason="acting as another user takes root")
async def test_another_local_user_cannot_reach_triton_while_the_workers_jobs_are_served(
    host: TritonHost, slot: ModelSlot
) -> None:
    """Anyone who reached Triton's gRPC could send it jobs, or load a Python model that runs code
    as the worker, and anyone who reached the model's job socket could run jobs on the engine;
    another user of the machine is refused at connect."""
    nobody = pwd.getpwnam("nobody")
    assert not reachable_by(nobody, host.grpc_address)
    job_socket = host._job_sockets[triton_model_name("m")].path
    assert not reachable_by(nobody, f"unix:{job_socket}"), "nor the socket the stub hands jobs over on"
    lease = slot.lease()
    try:
        assert len(await texts(lease.served.client, "fast 2")) == 2
    finally:
        lease.release()


def reachable_by(user: pwd.struct_passwd, target: str) -> bool:
    """Whether `user` can connect to the gRPC target (`unix:PATH` or `HOST:PORT`), tried in a child
    that becomes that user."""
    child = os.fork()
    if child == 0:  # only system calls here, then out: the parent's threads are not in the child
        code = 3
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            if target.startswith("unix:"):
                with socket.socket(socket.AF_UNIX) as unix:
                    unix.connect(target.removeprefix("unix:"))
            else:
                address, _, port = target.rpartition(":")
                socket.create_connection((address, int(port)), timeout=5).close()
            code = 0
        except PermissionError:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), f"the attempt failed otherwise (exit code {code})"
    return code == 0
