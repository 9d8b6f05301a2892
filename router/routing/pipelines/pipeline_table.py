"""The pipelines this front door knows, the config's and those set through the admin API, kept fresh
without a read per request.

The admin API's definitions live in Redis (`keys.pipelines`: name -> definition), over the config's:
a name the config has takes the stored definition, any other name is a pipeline the admin API
created. Requests look pipelines up in memory. One background task polls `keys.pipelines_version`
every POLL_S (one GET) and reads the hash again only when it moved, so that a change made through
any front door applies on every other within about POLL_S. Until Redis answers, the config's apply.

Every change is checked as the config is at start, over the whole set it would leave
(`check_pipelines` with the configured models and routes, then no loop through routes and
pipelines, and no name nested or expanding past the bounds of `check_nesting`), inside a transaction on the version: two front doors changing pipelines at once cannot
together make what neither would alone (two pipelines naming each other). A stored definition that
does not fit this front door's config (written by one with other models) is left out, and logged.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from router.routing.routes.route_table import poll_version
from router.telemetry.summarized_log import SummarizedLog
from switchboard import keys
from switchboard.config import PipelineConfig, RouteConfig
from switchboard.config.pipeline_checks import PipelineError, check_nesting, check_pipelines, leads_to
from switchboard.name_graph import LoopError, check_no_loop
from switchboard.tasks import TaskSet

logger = logging.getLogger(__name__)
# A Redis outage fails every poll: a line now and then, not two a second.
_poll_failures = SummarizedLog(logger)

# A change retried this many times while other front doors change pipelines under it.
WRITE_TRIES = 5

Source = Literal["config", "admin"]
_definition = msgspec.json.Decoder(PipelineConfig)
# Before the first read: unlike any version Redis answers, None (nothing stored yet) included.
_UNREAD = object()


class PipelineConflict(Exception):
    """A change that would leave something dangling or broken; the message says who or what."""


class UnknownPipeline(LookupError):
    """A name that is no pipeline, neither configured nor set through the admin API."""


@dataclass(frozen=True, slots=True)
class PipelineEntry:
    """A pipeline in effect, and whether its definition is the config's or the admin API's."""

    name: str
    config: PipelineConfig
    source: Source


class PipelineTable:
    """Every pipeline in effect here: the config's, with those set through the admin API over them."""

    def __init__(
        self,
        redis: aioredis.Redis,
        pipelines: Mapping[str, PipelineConfig],
        *,
        models: Collection[str],
        routes: Mapping[str, RouteConfig],
    ) -> None:
        self._redis = redis
        self._configured = dict(pipelines)
        self._models = list(models)
        self._routes = dict(routes)
        self._live = dict(self._configured)
        self._admin: set[str] = set()
        self._version: object = _UNREAD

    def get(self, name: str, /) -> PipelineConfig | None:
        """The pipeline `name` in effect; None for a name that is no pipeline. From memory only."""
        return self._live.get(name)

    def names(self) -> list[str]:
        """Every pipeline: the config's in its order, then those the admin API created, by name."""
        return list(self._live)

    def items(self) -> list[tuple[str, PipelineConfig]]:
        """Every pipeline with its definition in effect, in the order of `names`."""
        return list(self._live.items())

    def entry(self, name: str) -> PipelineEntry | None:
        """Pipeline `name` with where its definition comes from; None for a name that is no pipeline."""
        config = self._live.get(name)
        if config is None:
            return None
        return PipelineEntry(name, config, "admin" if name in self._admin else "config")

    async def refresh(self) -> None:
        """Read the admin API's definitions again if their version moved."""
        version = await self._redis.get(keys.pipelines_version())
        if version == self._version:
            return
        stored, unreadable = _decoded(await self._redis.hgetall(keys.pipelines()))  # type: ignore[misc]
        for name in unreadable:
            logger.warning("a stored pipeline definition cannot be read; left out", extra={"pipeline": name})
        admin, left_out = self._applicable(stored)
        for name, reason in left_out.items():
            logger.warning(
                "a pipeline set through the admin API does not fit this front door's config; left out",
                extra={"pipeline": name, "error": reason},
            )
        self._live = _merged(self._configured, admin)
        self._admin = set(admin)
        self._version = version

    async def put(self, name: str, config: PipelineConfig) -> PipelineEntry:
        """Set pipeline `name`'s definition (a configured one's, or a new pipeline), every front
        door's within about POLL_S. PipelineError or LoopError, changing nothing, unless the set it
        leaves passes the checks made at start."""

        def change(stored: dict[str, PipelineConfig], unreadable: set[str], pipe: Any) -> bool:
            # Over the set in effect: what names `name` must still fit its new definition.
            admin, _ = self._applicable(stored)
            self._check(_merged(self._configured, {**admin, name: config}))
            pipe.hset(keys.pipelines(), name, msgspec.json.encode(config))
            return True

        await self._write(change)
        # (None only if another front door removed it since)
        return self.entry(name) or PipelineEntry(name, config, "admin")

    async def remove(self, name: str) -> PipelineEntry | None:
        """Remove the admin API's definition of `name`: a configured pipeline returns to the config's
        (returned), one the admin API created goes (None). UnknownPipeline for a name that is neither;
        PipelineConflict, changing nothing, for one that routes or pipelines still name, or a
        configured one whose definition would no longer fit what the admin API set around it."""

        def change(stored: dict[str, PipelineConfig], unreadable: set[str], pipe: Any) -> bool:
            if name not in stored and name not in unreadable:
                if name in self._configured:
                    return False  # it has the config's definition already
                raise UnknownPipeline(name)
            admin, _ = self._applicable(stored)
            admin.pop(name, None)  # (one left out as not fitting is removed all the same)
            left = _merged(self._configured, admin)
            if name not in left:
                _require_unnamed(name, self._routes, left)
            try:
                self._check(left)
            except (PipelineError, LoopError) as exc:
                raise PipelineConflict(
                    f"pipeline {name!r} cannot return to its configured definition: {exc}"
                ) from None
            pipe.hdel(keys.pipelines(), name)
            return True

        await self._write(change)
        return self.entry(name)

    def start(self, tasks: TaskSet) -> None:
        """Poll the pipelines' version in the background while `tasks` runs."""
        tasks.start(self._poll(), "pipelines")

    async def _write(self, change: Callable[[dict[str, PipelineConfig], set[str], Any], bool]) -> None:
        """Run `change(stored, unreadable, pipe)` on the definitions Redis holds now (and the names of
        those it cannot read: written by another version), and commit what it staged on
        `pipe` (if it says it staged anything) with a new version, unless another front door changed
        them meanwhile (then again). What `change` raises leaves Redis as it was."""
        for _ in range(WRITE_TRIES):
            async with self._redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(keys.pipelines_version(), keys.pipelines())
                    stored, unreadable = _decoded(await pipe.hgetall(keys.pipelines()))
                    pipe.multi()
                    if not change(stored, unreadable, pipe):
                        break
                    pipe.set(keys.pipelines_version(), uuid.uuid4().hex)
                    await pipe.execute()
                    break
                except WatchError:
                    continue
        else:
            raise PipelineConflict("the pipelines kept changing under this change; try again")
        self._version = _UNREAD
        await self.refresh()

    def _check(self, pipelines: Mapping[str, PipelineConfig]) -> None:
        check_pipelines(pipelines, self._models, list(self._routes))
        graph = leads_to(self._routes, pipelines)
        check_no_loop(graph)
        check_nesting(graph)

    def _applicable(
        self, stored: Mapping[str, PipelineConfig]
    ) -> tuple[dict[str, PipelineConfig], dict[str, str]]:
        """The stored definitions that fit with the config (all of them, but for one written by a
        front door with another config), and why each other one does not."""
        try:
            self._check(_merged(self._configured, stored))
            return dict(stored), {}
        except (PipelineError, LoopError):
            pass
        # Added one at a time while any fits (a pipeline may name one added after it).
        kept: dict[str, PipelineConfig] = {}
        pending = dict(stored)
        while True:
            reasons: dict[str, str] = {}
            before = len(pending)
            for name, config in list(pending.items()):
                try:
                    self._check(_merged(self._configured, {**kept, name: config}))
                except (PipelineError, LoopError) as exc:
                    reasons[name] = str(exc)
                    continue
                kept[name] = pending.pop(name)
            if len(pending) == before:  # none added in this pass: the rest never fit
                return kept, reasons

    async def _poll(self) -> None:
        await poll_version(
            self.refresh,
            _poll_failures,
            "pipelines_unread",
            "could not read the pipelines set through the admin API (the last ones read still apply)",
        )


def _merged(
    configured: Mapping[str, PipelineConfig], admin: Mapping[str, PipelineConfig]
) -> dict[str, PipelineConfig]:
    """The config's pipelines in their order, each with the admin API's definition if it has one,
    then the admin API's others by name."""
    merged = {name: admin.get(name, config) for name, config in configured.items()}
    merged.update((name, admin[name]) for name in sorted(admin) if name not in configured)
    return merged


def _require_unnamed(
    name: str, routes: Mapping[str, RouteConfig], pipelines: Mapping[str, PipelineConfig]
) -> None:
    """PipelineConflict if a route or pipeline sends requests to `name`: removing it would leave them
    naming nothing."""
    users = [f"route {route!r}" for route, config in routes.items() if name in config.targets]
    users += [f"pipeline {other!r}" for other, config in pipelines.items() if name in config.steps()]
    if users:
        raise PipelineConflict(
            f"pipeline {name!r} is named by {', '.join(users)}; change those first, then delete it"
        )


def _decoded(fields: Mapping[Any, Any]) -> tuple[dict[str, PipelineConfig], set[str]]:
    """The definitions a `keys.pipelines` hash holds, and the names of those that cannot be read (a
    front door of another version wrote them): left out, but `DELETE` still removes them."""
    found, unreadable = {}, set()
    for raw_name, raw in fields.items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        try:
            found[name] = _definition.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError):
            unreadable.add(name)
    return found, unreadable
