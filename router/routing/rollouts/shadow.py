"""Shadow traffic: a share of a route's requests copied to its shadow version, which nobody sees.

After a routed request's job is queued, a draw below the route's `shadow.percent` copies it
(`ShadowTraffic.mirror`; once per request, by the request's own id: a fallback's job is not drawn
again): a new job for the shadow model, with the same messages or prompts, sampling
and deadline, `shadow` set and no tenant. Everything about the copy happens in a background task of
the front door, so the real request never waits for it and never sees its errors:

- at most MAX_COPIES_IN_FLIGHT copies run per front door; a draw beyond that is dropped ("dropped_busy");
- the shadow model's status is the shared cached read (`ModelStatusReader.read_shared`): without
  `may_load`, a copy goes only while a live worker holds the model warm ("dropped_cold"), and none
  goes while `max_waiting` jobs wait on its queue ("dropped_queue") — as the status read says, or as
  this front door's own copies not started yet say (the read may be a second old);
- the copy is queued without admission (no key's limits, no in-flight slot, nothing billed), read to
  its end through the result reader, and its results deleted; a worker without a slot to spare
  answers it "shadow_dropped" (`workers.jobs.consume`), counted as "dropped_busy".

Outcomes go to `switchboard:shadow_requests_total{route, model, outcome}`, the copy's time to first
token and inter-token latency to histograms of their own. With `keep_answers`, the real answer is read
too (a second reader of its results, which costs no round trip) and each pair lands in
`keys.shadow_answers(route)` (`switchboard shadow-answers ROUTE` prints them).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import redis.asyncio as aioredis
from prometheus_client import Counter, Histogram
from redis.exceptions import RedisError

from router.openai.errors import OpenAIError
from router.queue.enqueue import JobQueue
from router.queue.results import ResultReader
from router.queue.run import JobRun
from router.queue.subscription import Subscription
from router.status.model_status import ModelStatus, ModelStatusReader
from router.telemetry.requests import arrival_id
from switchboard import keys
from switchboard.config import FrontDoorConfig, RouteConfig, ShadowConfig
from switchboard.metrics import REGISTRY, TPOT_BUCKETS, TTFT_BUCKETS
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, Job

logger = logging.getLogger(__name__)

Outcome = Literal["answered", "failed", "dropped_queue", "dropped_cold", "dropped_busy"]

# Copies one front door runs at once: a shadow version that never answers holds each until its
# deadline, and must not hold more than this much of the front door.
MAX_COPIES_IN_FLIGHT = 32
# How old the shadow model's status may be (the same shared read the relay's progress comments use).
STATUS_MAX_AGE_S = 1.0
# Requests whose copy was drawn lately, remembered so that a fallback's job is not drawn again.
RECENT_DRAWS = 4096
# The owner of every copy's record: no key's identity (a SHA-256, or "" without keys), so no caller
# may resume a copy's stream.
SHADOW_OWNER = "shadow"

SHADOW_REQUESTS = Counter(
    "switchboard:shadow_requests",
    "Copies of routed requests drawn for the route's shadow version, by outcome: answered, failed, "
    "dropped_queue (its queue was long), dropped_cold (no worker held it warm), dropped_busy (no room "
    "on the front door or the worker).",
    ["route", "model", "outcome"],
    registry=REGISTRY,
)
SHADOW_TIME_TO_FIRST_TOKEN = Histogram(
    "switchboard:shadow_time_to_first_token_seconds",
    "From a shadow copy's enqueue (its start) to its first result chunk.",
    ["route", "model"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
SHADOW_INTER_TOKEN_LATENCY = Histogram(
    "switchboard:shadow_inter_token_latency_seconds",
    "A shadow copy's time per output token after its first: (last chunk - first chunk) / (tokens - 1).",
    ["route", "model"],
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)


def drawn(percent: float, draw: Callable[[], float] = random.random) -> bool:
    """Whether one request is copied, for a share of `percent` (0 to 100) of them."""
    return draw() * 100.0 < percent


def shadow_copy(job: Job, model: str) -> Job:
    """The copy of the queued `job` for the shadow `model`: a new id, no tenant, no trace (the
    caller's trace must not show work the caller never asked for), the same deadline."""
    return msgspec.structs.replace(
        job, id=uuid.uuid4().hex, model=model, tenant=None, trace=None, shadow=True, created=time.time()
    )


def dropped_before_queueing(config: ShadowConfig, status: ModelStatus, unstarted: int = 0) -> Outcome | None:
    """Why a copy is not queued, as the shadow model stands and with `unstarted` copies of this front
    door queued and not started yet; None: it is queued."""
    if not config.may_load and status.state != "warm":
        return "dropped_cold"
    # The status counts this front door's copies too, unless it was read before they were queued.
    if max(status.waiting, unstarted) >= config.max_waiting:
        return "dropped_queue"
    return None


@dataclass
class ComparedAnswer:
    """One answer as read from its result chunks: its first choice's text, and how it ended."""

    started: float  # loop time the job was queued
    text: list[str] = field(default_factory=list)
    first_at: float | None = None
    last_at: float | None = None
    finish_reason: str | None = None
    error_code: str | None = None
    completion_tokens: int = 0

    def add(self, chunk: Chunk, at: float) -> None:
        if self.first_at is None:
            self.first_at = at
        self.last_at = at
        if chunk.index == 0:
            self.text.append(chunk.text)
            self.finish_reason = chunk.finish_reason or self.finish_reason
        if chunk.error is not None:
            self.error_code = chunk.error.code
        if chunk.usage is not None:
            self.completion_tokens = chunk.usage.completion_tokens

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.started

    @property
    def inter_token_s(self) -> float | None:
        if self.first_at is None or self.last_at is None or self.completion_tokens < 2:
            return None
        return (self.last_at - self.first_at) / (self.completion_tokens - 1)

    @property
    def outcome(self) -> Outcome:
        if self.error_code == "shadow_dropped":
            return "dropped_busy"
        return "failed" if self.error_code is not None else "answered"


class Unstarted:
    """One copy counted among its model's copies not started yet, until `started` (idempotent)."""

    def __init__(self, counts: dict[str, int], model: str) -> None:
        self._counts = counts
        self._model = model
        self._counted = True
        counts[model] = counts.get(model, 0) + 1

    def started(self) -> None:
        if self._counted:
            self._counted = False
            self._counts[self._model] -= 1


@dataclass(frozen=True)
class ShadowDraw:
    """A real job drawn for a copy: its route's shadow, and the real answer's reader (for a shadow
    that keeps answers); `busy`: too many copies are in flight, so it is not copied."""

    config: ShadowConfig
    served: Subscription | None
    busy: bool = False


class ShadowTraffic:
    """Copies a share of each shadowed route's requests to its shadow version, in the background."""

    def __init__(
        self,
        routes: Mapping[str, RouteConfig],
        *,
        redis: aioredis.Redis,
        queue: JobQueue,
        reader: ResultReader,
        status: ModelStatusReader,
        tasks: TaskSet,
        settings: FrontDoorConfig,
        max_in_flight: int = MAX_COPIES_IN_FLIGHT,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._shadows = {name: route.shadow for name, route in routes.items() if route.shadow is not None}
        self._redis = redis
        self._queue = queue
        self._reader = reader
        self._status = status
        self._tasks = tasks
        self._settings = settings
        self._max_in_flight = max_in_flight
        self._draw = draw
        self.in_flight = 0
        self._drawn: OrderedDict[str, None] = OrderedDict()
        # Per shadow model, this front door's copies queued and not started yet.
        self._unstarted: dict[str, int] = {}

    async def queued(self, job: Job, queue: Callable[[Job], Awaitable[JobRun]]) -> JobRun:
        """`job` queued by `queue`, and copied for its route's shadow version once it is (drawn before
        it is queued: `draw`)."""
        draw = self.draw(job)
        try:
            run = await queue(job)
        except BaseException:
            if draw is not None:
                self.drop(draw)
            raise
        if draw is not None:
            self.mirror(run.job, draw)
        return run

    def draw(self, job: Job) -> ShadowDraw | None:
        """Before `job` (a real one) is queued: whether its route's shadow copies it (the draw says so);
        `mirror` then copies it once it is queued, `drop` forgets the draw if it is not. A copy that
        keeps answers reads the real answer from now on, before a fast worker can end the job and
        its results be deleted. Never raises, never waits."""
        config = self._shadows.get(job.route) if job.route is not None else None
        if (
            config is None
            or not self._first_draw(arrival_id() or job.id)
            or not drawn(config.percent, self._draw)
        ):
            return None
        if self.in_flight >= self._max_in_flight:
            return ShadowDraw(config, served=None, busy=True)
        self.in_flight += 1
        served = self._reader.subscribe(job.id, job.model, streamed=True) if config.keep_answers else None
        return ShadowDraw(config, served=served)

    def mirror(self, job: Job, draw: ShadowDraw) -> None:
        """After `job` was queued: its copy, in a task of its own. Never raises, never waits."""
        if draw.busy:
            SHADOW_REQUESTS.labels(job.route, draw.config.model, "dropped_busy").inc()
            return
        if draw.served is not None:
            draw.served.queued = True
        queued_at = asyncio.get_running_loop().time()
        self._tasks.start(self._copied(job, draw.config, draw.served, queued_at), "shadow copy")

    def drop(self, draw: ShadowDraw) -> None:
        """The real job was not queued: nothing is copied, and its answer is not read."""
        if draw.busy:
            return
        self.in_flight -= 1
        if draw.served is not None:
            self._reader.unsubscribe(draw.served, keep=True)

    def _first_draw(self, request_id: str) -> bool:
        """Whether this is the request's first job drawn for (not the job of one of its fallbacks)."""
        if request_id in self._drawn:
            return False
        self._drawn[request_id] = None
        if len(self._drawn) > RECENT_DRAWS:
            self._drawn.popitem(last=False)
        return True

    async def _copied(
        self, job: Job, config: ShadowConfig, served: Subscription | None, queued_at: float
    ) -> None:
        route = job.route or ""
        try:
            outcome = await self._copy(job, config, served, queued_at)
        except (RedisError, OpenAIError, OSError) as exc:
            logger.info(
                "a shadow copy failed",
                extra={"route": route, "model": config.model, "error": str(exc) or type(exc).__name__},
            )
            outcome = "failed"
        except Exception:
            # Not the caller's concern, whatever it was: logged with its trace, never raised.
            logger.info("a shadow copy failed", exc_info=True, extra={"route": route, "model": config.model})
            outcome = "failed"
        finally:
            self.in_flight -= 1
            if served is not None and not served.released:
                # Kept (to expire): the real request may still read them, or its client resume them.
                self._reader.unsubscribe(served, keep=True)
        SHADOW_REQUESTS.labels(route, config.model, outcome).inc()

    async def _copy(
        self, job: Job, config: ShadowConfig, served: Subscription | None, queued_at: float
    ) -> Outcome:
        """The copy's outcome; `served` reads the real answer, whose job was queued at `queued_at`."""
        status = await self._status.read_shared(config.model, STATUS_MAX_AGE_S)
        dropped = dropped_before_queueing(config, status, self._unstarted.get(config.model, 0))
        if dropped is not None:
            return dropped
        copy = shadow_copy(job, config.model)
        unstarted = Unstarted(self._unstarted, config.model)
        started = asyncio.get_running_loop().time()
        try:
            run = await self._queued(copy)
            if run is None:
                return "failed"  # the shadow model's last load failed
            if served is None:
                answer = await self._read(run, unstarted, started)
                self._observe(job.route or "", config.model, answer)
                return answer.outcome
            answer, real = await asyncio.gather(
                self._read(run, unstarted, started), self._read_served(job, served, queued_at)
            )
        finally:
            unstarted.started()
        self._observe(job.route or "", config.model, answer)
        if answer.outcome == "answered" and real.error_code is None:
            await self._keep(job, copy, real, answer)
        return answer.outcome

    async def _queued(self, copy: Job) -> JobRun | None:
        """The copy queued without admission, its results read from the start; None if the shadow
        model's last load failed (nothing is queued)."""
        subscription = self._reader.subscribe(copy.id, copy.model, from_inbox=True)
        try:
            failure = await self._queue.submit(copy, owner=SHADOW_OWNER)
        except BaseException:
            self._reader.unsubscribe(subscription)
            raise
        if failure is not None:
            self._reader.unsubscribe(subscription)
            return None
        subscription.queued = True
        return JobRun(
            copy,
            subscription,
            reader=self._reader,
            queue=self._queue,
            status=self._status,
            timeout_s=self._settings.request_timeout_s,
            ticket=None,
        )

    async def _read(self, run: JobRun, unstarted: Unstarted, started: float) -> ComparedAnswer:
        """The copy's answer, read to its end (or its deadline); its results are deleted after."""
        loop = asyncio.get_running_loop()
        answer = ComparedAnswer(started=started)
        try:
            async for chunk in run.chunks():
                unstarted.started()
                answer.add(chunk, loop.time())
        finally:
            # An unfinished copy (its deadline passed, the front door stops) is cancelled too.
            await run.close()
        return answer

    async def _read_served(self, job: Job, served: Subscription, queued_at: float) -> ComparedAnswer:
        """The real answer, read beside the request that relays it, until its end or its deadline."""
        loop = asyncio.get_running_loop()
        answer = ComparedAnswer(started=queued_at)
        deadline = loop.time() + (job.deadline - time.time())
        try:
            while True:
                _, chunk = await served.get(deadline)
                answer.add(chunk, loop.time())
                if chunk.is_last:
                    return answer
        except TimeoutError:
            answer.error_code = "timeout"
            return answer

    def _observe(self, route: str, model: str, answer: ComparedAnswer) -> None:
        if answer.outcome != "answered":
            return
        if answer.ttft_s is not None:
            SHADOW_TIME_TO_FIRST_TOKEN.labels(route, model).observe(answer.ttft_s)
        if answer.inter_token_s is not None:
            SHADOW_INTER_TOKEN_LATENCY.labels(route, model).observe(answer.inter_token_s)

    async def _keep(self, job: Job, copy: Job, real: ComparedAnswer, shadow: ComparedAnswer) -> None:
        """Add the compared pair to its route's capped stream of answers."""
        pair = {
            "request_id": job.id,
            "served_model": job.model,
            "served_text": "".join(real.text),
            "served_ttft_s": real.ttft_s,
            "served_finish_reason": real.finish_reason,
            "shadow_model": copy.model,
            "shadow_text": "".join(shadow.text),
            "shadow_ttft_s": shadow.ttft_s,
            "shadow_finish_reason": shadow.finish_reason,
        }
        stream = keys.shadow_answers(job.route or "")
        pipe = self._redis.pipeline(transaction=False)
        fields = {name: _field(value) for name, value in pair.items()}
        pipe.xadd(stream, fields, maxlen=keys.SHADOW_ANSWERS_MAXLEN, approximate=True)  # type: ignore[arg-type]
        pipe.expire(stream, keys.SHADOW_ANSWERS_TTL_S)
        await pipe.execute()


def _field(value: str | float | None) -> str:
    """A field of a kept pair as redis-cli shows it best: text as it is, seconds rounded, "" for none."""
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else value
