"""One configured model on one worker: its residency state, and every transition of it.

`ModelSlot` is the only owner of a model's state on a worker: `cold → loading → warm → sleeping →
unloading → cold`. Callers ask for an outcome (`ensure_warm`, `sleep`, `unload`) and never read the
state to decide, because a read that gates a transition races the next transition. Load and unload
are mirror images: hold the model's files (fetched into the node cache first, for a remote model) →
create the engine → start it (while Triton binds it) → open the job client, and close the client →
stop the engine → unbind it from Triton → let the files go.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from switchboard import keep_alive
from switchboard.config import ModelConfig, triton_model_name
from switchboard.wire import (
    DownloadStatus,
    ModelLimits,
    SamplingParams,
    SlotState,
    SlotStatus,
    StructuredOutput,
)
from workers.engines.base import Engine, EngineRequest, PoolingEngine
from workers.models.files import HeldFiles, ModelFiles
from workers.triton.generator.client import TritonJobClient
from workers.triton.generator.model import GeneratorModel
from workers.triton.host import TritonHost
from workers.triton.pooling.client import PoolingJobClient
from workers.triton.pooling.model import PoolingModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """A warm model's handles: the client of its Triton model, and that model's callable (a pooling
    model's have the same faces: `stream` a job, and the engine's loop, abort and stop)."""

    name: str
    client: TritonJobClient | PoolingJobClient
    triton_model: GeneratorModel | PoolingModel


class SlotNotServing(RuntimeError):
    """The model stopped taking jobs here (it is going to sleep or leaving)."""


class LoadFailed(RuntimeError):
    """A load (or wake) of the model failed; the message says why."""


class Lease:
    """One job's hold on a warm model: the model is not put to sleep or unloaded under it."""

    __slots__ = ("_also", "_batch", "_released", "_slot", "served")

    def __init__(
        self, slot: ModelSlot, served: ServedModel, *, also: Lease | None = None, batch: bool = False
    ) -> None:
        """`also`: a lease released with this one (an adapter's job holds its base as well);
        `batch`: held by a batch line, which does not keep the model warm."""
        self._slot = slot
        self._released = False
        self._also = also
        self._batch = batch
        self.served = served

    def release(self) -> None:
        """The job is over (idempotent)."""
        if not self._released:
            self._released = True
            self._slot._job_ended(batch=self._batch)
            if self._also is not None:
                self._also.release()


class ModelSlot:
    """One configured model on this worker. Its state changes only inside these methods."""

    def __init__(
        self,
        model: ModelConfig,
        *,
        host: TritonHost,
        host_started: asyncio.Event,
        create_engine: Callable[[ModelConfig], Engine],
        read_barrier: Callable[[], Awaitable[None]],
        on_change: Callable[[], None],
        on_jobs: Callable[[], None] = lambda: None,
        files: ModelFiles | None = None,
    ) -> None:
        """`files`: where the worker's models' files are (None: every model's `path` is a local folder)."""
        self.model = model
        self.name = model.name
        self._host = host
        self._host_started = host_started
        self._create_engine = create_engine
        self._read_barrier = read_barrier
        self._on_change = on_change
        # Told after a job of this model starts or ends (the engines' CPU priorities follow).
        self._on_jobs = on_jobs
        self._lock = asyncio.Lock()
        self._drained = asyncio.Event()
        self._drained.set()
        self._state: SlotState = "cold"
        self._served: ServedModel | None = None
        self._engine: Engine | None = None
        self._model_files = files
        # The files the held model was loaded from (the node cache keeps them while they are held).
        self._files: HeldFiles | None = None
        # The files of the last load that got them: what it fetched, and how long that took.
        self.last_files: HeldFiles | None = None
        self._taking_jobs = False
        self._attempts_done = 0
        self._last_failure: BaseException | None = None
        # Set by the controller: which replica lease it holds, and how long the load should take.
        self.replica: int | None = None
        self.expected_load_s: float | None = None
        self.load_started: float | None = None
        # Where the last load or wake started from ("cold" or "sleeping"): a cold start's tier.
        self.warmed_from: SlotState | None = None
        self.warm_since: float | None = None
        # When its last interactive job here ended (or it became warm): batch lines alone do not
        # keep a model warm (`workers.controller.policy`'s keep-alive).
        self.idle_since: float | None = None
        self.in_flight = 0
        # Of `in_flight`, the Batch API's lines.
        self.batch_in_flight = 0
        # Jobs on the model's stream that no worker has taken, as the controller's last pass read them.
        self.jobs_waiting = 0
        self._completed = 0
        self._busy_s = 0.0
        self._busy_since = 0.0
        # The adapters served on this model's engine here: they leave before it does.
        self.adapters: list[ModelSlot] = []

    # --- the transitions --------------------------------------------------------------------

    async def ensure_warm(self) -> ServedModel:
        """Bring the model to WARM and return its handle.

        warm -> at once; cold -> load; sleeping -> wake; loading -> join that load (and share its
        failure); unloading -> wait for it, then load. Callers never read `state` to decide.
        """
        attempts_seen = self._attempts_done
        async with self._lock:
            if self._attempts_done != attempts_seen and self._last_failure is not None:
                raise LoadFailed(str(self._last_failure)) from self._last_failure
            if self._state == "sleeping":
                await self._guarded(self._wake)
            elif self._state == "cold":
                await self._guarded(self._load)
            assert self._served is not None
            return self._served

    async def sleep(self) -> None:
        """Stop taking jobs, let running ones finish, then put the engine to sleep (warm only)."""
        async with self._lock:
            if self._state != "warm" or self._engine is None or not self._engine.supports_sleep:
                return
            await self._unload_adapters()
            await self._stop_taking_jobs("sleeping")
            assert self._served is not None
            await asyncio.wrap_future(self._served.triton_model.on_engine_loop(self._engine.sleep))

    async def unload(self) -> None:
        """Stop taking jobs, let running ones finish, then release the engine and its Triton model."""
        async with self._lock:
            if self._state == "cold":
                return
            await self._unload_adapters()
            await self._stop_taking_jobs("unloading")
            try:
                await self._release()
            finally:
                # Even when the engine's stop failed (its process already gone): a slot stuck in
                # "unloading" could never load the model again.
                self._set_state("cold")

    async def _unload_adapters(self) -> None:
        """Unload the adapters held on this model's engine, each after its own jobs end."""
        held = [adapter for adapter in self.adapters if adapter.state != "cold"]
        if held:
            await asyncio.gather(*(adapter.unload() for adapter in held))

    def serving(self) -> ServedModel | None:
        """The warm model's handles while it takes jobs (an adapter loads onto them), else None."""
        return self._served if self._taking_jobs and self._state == "warm" else None

    def waited_while_warm(self, created: float) -> float:
        """How long a job made at `created` has waited in line while this model was warm here (the
        wait for its load is not counted)."""
        since = max(created, self.warm_since or 0.0)
        return max(0.0, time.time() - since)

    def lease(self, *, also: Lease | None = None, batch: bool = False) -> Lease:
        """Hold the warm model for one job; taken synchronously before the job's task starts.
        `also`: a lease of another model that this job's ends with it; `batch`: for a batch line."""
        if not self._taking_jobs or self._served is None:
            raise SlotNotServing(f"{self.name} is not taking jobs here")
        if self.in_flight == 0:
            self._busy_since = time.monotonic()
            self._drained.clear()
        self.in_flight += 1
        self.batch_in_flight += batch
        self._on_jobs()
        return Lease(self, self._served, also=also, batch=batch)

    def abort(self, job_id: str, *, arriving: bool = False) -> Awaitable[None]:
        """Abort a running job in the engine; its stream ends with finish reason "abort".
        `arriving`: see `GeneratorModel.abort`."""
        if self._served is None:
            raise SlotNotServing(f"{self.name} is not loaded here")
        return asyncio.wrap_future(self._served.triton_model.abort(job_id, arriving=arriving))

    # --- what others may read ---------------------------------------------------------------

    @property
    def state(self) -> SlotState:
        """For reports (heartbeat, logs, tests): never read it to decide a transition."""
        return self._state

    @property
    def wants_jobs(self) -> bool:
        """Whether the consumer should read this model's job stream: while warm, and its engine can
        generate (the jobs of one that ended wait in the stream for the model's next load)."""
        return self._state == "warm" and self.engine_ended() is None

    def engine_ended(self) -> str | None:
        """Why the warm model's engine can no longer generate, if so (the controller unloads it)."""
        if self._state != "warm" or self._engine is None:
            return None
        return self._engine.ended()

    @property
    def engine(self) -> Engine | None:
        """The engine while the model is held here."""
        return self._engine

    def limits(self) -> ModelLimits | None:
        """What the held model accepts, when its engine says."""
        return self._engine.limits() if self._engine is not None else None

    def jobs_per_s(self) -> float:
        """Jobs finished per second of time with work, since the model became warm."""
        busy = self._busy_s + (time.monotonic() - self._busy_since if self.in_flight else 0.0)
        return self._completed / busy if busy > 0 else 0.0

    def memory_bytes(self) -> int:
        """What the engine occupies while held here (0 when cold)."""
        return self._engine.footprint().memory_bytes if self._engine is not None else 0

    def status(self) -> SlotStatus:
        """How the heartbeat advertises this slot."""
        return SlotStatus(
            model=self.name,
            state=self._state,
            replica=self.replica,
            in_flight=self.in_flight,
            load_started=self.load_started,
            expected_load_s=self.expected_load_s,
            warm_since=self.warm_since,
            idle_since=self.idle_since,
            leaves_at=self.leaves_at(),
            memory_bytes=self.memory_bytes(),
            jobs_per_s=round(self.jobs_per_s(), 3),
            waiting=self.jobs_waiting,
            download=self.download,
        )

    @property
    def download(self) -> DownloadStatus | None:
        """How far the fetch of the model's files has come, while its load waits for them."""
        if self._state != "loading" or self._model_files is None:
            return None
        return self._model_files.progress(self.name)

    def leaves_at(self) -> float | None:
        """When keep-alive will move the slot down the ladder, if nothing uses it meanwhile."""
        return keep_alive.leaves_at(
            self._state,
            self.idle_since,
            keep_alive_s=self.model.keep_alive_s,
            asleep_keep_alive_s=self.model.asleep_keep_alive_s,
            in_flight=self.in_flight,
            min_replicas=self.model.min_replicas,
        )

    # --- inside the transitions -------------------------------------------------------------

    async def _guarded(self, transition: Callable[[], Awaitable[None]]) -> None:
        """Run a load or wake, remembering its failure for the callers that joined it."""
        self._last_failure = None
        try:
            await transition()
        except Exception as exc:
            self._last_failure = exc
            raise LoadFailed(str(exc) or type(exc).__name__) from exc
        finally:
            self._attempts_done += 1

    async def _load(self) -> None:
        self.load_started = time.time()
        self.warmed_from = "cold"
        self._set_state("loading")
        try:
            await self._host_started.wait()
            files = await self._hold_files()
            try:
                engine = self._create_engine(files.model)
                triton_model = await _start_and_bind(
                    engine, self._host, self.name, warm_structured_output=self.model.warm_structured_output
                )
            except BaseException:
                files.release()
                raise
        except BaseException:
            self._set_state("cold")
            raise
        self._files = files
        self._engine = engine
        client = _job_client(self._host, self.model, engine, triton_model)
        self._served = ServedModel(name=self.name, client=client, triton_model=triton_model)
        self._became_warm()

    async def _hold_files(self) -> HeldFiles:
        """The files this load starts the engine from: fetched into the node cache first if need be."""
        if self._model_files is None:
            files = HeldFiles(model=self.model)
        else:
            files = await self._model_files.hold(self.model)
        self.last_files = files
        return files

    async def _wake(self) -> None:
        assert self._engine is not None and self._served is not None
        self.load_started = time.time()
        self.warmed_from = "sleeping"
        self._set_state("loading")
        try:
            await asyncio.wrap_future(self._served.triton_model.on_engine_loop(self._engine.wake))
        except BaseException:
            self._set_state("sleeping")
            raise
        self._became_warm()

    async def _release(self) -> None:
        served, engine, files = self._served, self._engine, self._files
        self._served = None
        self._engine = None
        self._files = None
        try:
            if served is not None:
                await served.client.close()
                try:
                    await served.triton_model.stop_engine()
                finally:
                    await asyncio.to_thread(self._host.unbind, self.name)
            elif engine is not None:
                await engine.stop()
        finally:
            if files is not None:
                files.release()

    async def _stop_taking_jobs(self, state: SlotState) -> None:
        """Leave the consumer's reads, then wait for the jobs in flight to end."""
        self._set_state(state)
        # A read that began before the state changed may still hand this model jobs; they are
        # leased and served like any other, so wait for that read before closing to new leases.
        await self._read_barrier()
        self._taking_jobs = False
        await self._drained.wait()

    def _became_warm(self) -> None:
        now = time.time()
        self.warm_since = self.idle_since = now
        self._completed, self._busy_s = 0, 0.0
        self._taking_jobs = True
        self._set_state("warm")

    def _job_ended(self, *, batch: bool = False) -> None:
        self.in_flight -= 1
        self.batch_in_flight -= batch
        self._completed += 1
        if self.in_flight == self.batch_in_flight and not batch:
            self.idle_since = time.time()
        if self.in_flight == 0:
            self._busy_s += time.monotonic() - self._busy_since
            self._drained.set()
        self._on_jobs()

    def _set_state(self, state: SlotState) -> None:
        # Leaving warm, the consumer stops reading the model's stream on its next pass.
        self._state = state
        self._on_change()


def _job_client(
    host: TritonHost, model: ModelConfig, engine: Engine, triton_model: GeneratorModel | PoolingModel
) -> TritonJobClient | PoolingJobClient:
    """The consumer's client of the model's Triton model: one stream for every job of a generator
    (their chunks handed over in this process); batched requests of a pooling model's rows (the
    model loaded into Triton again when its stub dies)."""
    name = triton_model_name(model.name)
    if isinstance(engine, PoolingEngine):
        return PoolingJobClient(
            host.grpc_address,
            name,
            max_batch_size=model.batching.max_batch_size,
            labels=engine.labels(),
            together=model.batching.enabled,
            model=model.name,
            on_stub_lost=lambda: host.load_again_after_stub_loss(model.name),
        )
    assert isinstance(triton_model, GeneratorModel)
    return TritonJobClient(host.grpc_address, name, local=triton_model)


async def _start_and_bind(
    engine: Engine, host: TritonHost, name: str, *, warm_structured_output: bool = False
) -> GeneratorModel | PoolingModel:
    """Start the engine while Triton binds it (about 2 s of Triton's own work, done in parallel);
    with `warm_structured_output`, the engine's first constrained answer is made once both are done.

    Whatever fails, nothing is left behind: a bound model is unbound and the engine stopped. A
    cancelled load (the worker is stopping) waits for both to finish before cleaning up, since
    neither thread can be interrupted.
    """
    starting = asyncio.ensure_future(engine.start())
    binding = asyncio.ensure_future(asyncio.to_thread(host.bind, name, engine))
    both = asyncio.gather(starting, binding, return_exceptions=True)
    try:
        started, bound = await asyncio.shield(both)
    except asyncio.CancelledError:
        started, bound = await both
        started = started if isinstance(started, BaseException) else asyncio.CancelledError()
    if isinstance(started, BaseException) or isinstance(bound, BaseException):
        if not isinstance(bound, BaseException):
            await asyncio.to_thread(host.unbind, name)
        await engine.stop()
        error = started if isinstance(started, BaseException) else bound
        assert isinstance(error, BaseException)
        raise error
    assert isinstance(bound, GeneratorModel | PoolingModel)
    if warm_structured_output and isinstance(bound, GeneratorModel):
        # On the engine's loop: vLLM's output task lives on the loop its first request ran on.
        await asyncio.wrap_future(bound.on_engine_loop(lambda: warm_structured_output_of(engine)))
    return bound


# A constrained answer of one token: it makes the engine set its structured-output backend up.
_WARM_UP = SamplingParams(max_tokens=1, temperature=0.0, structured=StructuredOutput(choice=("yes", "no")))


async def warm_structured_output_of(engine: Engine) -> None:
    """Make the engine's first constrained answer now (seconds on a CPU: its grammar backend starts),
    not a router's first request's. A failure only costs that request the wait; it is logged."""
    request = EngineRequest(
        request_id=f"warm-up-{uuid.uuid4().hex[:8]}", sampling=_WARM_UP, prompt="Yes or no?"
    )
    started = time.perf_counter()
    try:
        async for _ in engine.generate(request):
            pass
    except Exception:
        logger.warning("could not warm the structured-output backend up", exc_info=True)
        return
    logger.info("structured output warmed up", extra={"seconds": round(time.perf_counter() - started, 3)})
