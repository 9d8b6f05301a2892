"""The routes this front door knows, with their live weights, kept fresh without a read per request.

Requests read weights from memory. One background task polls `keys.routes_version` every
POLL_S (one GET) and reads every route's hash again only when it moved, so a change made through
any front door applies on every other within about POLL_S, at no cost to requests. Until Redis
answers, the configured weights apply; a route Redis holds nothing for is seeded from the config.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.telemetry.summarized_log import SummarizedLog
from switchboard import keys
from switchboard.config import RouteConfig
from switchboard.routes import Route, checked_weights, route_from_fields, seed_route, write_weights
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)
# A Redis outage fails every poll: a line now and then, not two a second.
_poll_failures = SummarizedLog(logger)

# How often the routes' version is polled: how long a weight change takes to reach every front door.
POLL_S = 0.5


class RouteTable:
    """Every configured route with the weights last read from Redis (the config's before that)."""

    def __init__(self, redis: aioredis.Redis, routes: Mapping[str, RouteConfig]) -> None:
        self._redis = redis
        self._configured = {name: _configured(name, config) for name, config in routes.items()}
        self._live = dict(self._configured)
        self._version: bytes | str | None = None

    def names(self) -> list[str]:
        """Every route, in the config's order."""
        return list(self._configured)

    def get(self, name: str) -> Route | None:
        """The route `name` with its live weights; None for a name that is no route."""
        return self._live.get(name)

    async def refresh(self) -> None:
        """Read the routes again if their version moved; seed those Redis holds nothing for."""
        if not self._configured:
            return
        version = await self._redis.get(keys.routes_version())
        if version is not None and version == self._version:
            return
        pipe = self._redis.pipeline(transaction=False)
        for name in self._configured:
            pipe.hgetall(keys.route(name))
        for name, fields in zip(self._configured, await pipe.execute(), strict=True):
            configured = self._configured[name]
            live = route_from_fields(name, configured.targets, fields)
            if live is None:
                await seed_route(self._redis, configured)
                version = None  # read again on the next poll, seeded
            self._live[name] = live or self._live[name]
        self._version = version

    async def set_weights(self, name: str, weights: Mapping[str, object]) -> Route:
        """Store new weights for route `name` (WeightsError unless they fit its targets), and read it back."""
        route = self._configured[name]
        ordered = checked_weights(route.targets, weights)
        await write_weights(self._redis, name, ordered, route.targets)
        self._version = None
        await self.refresh()
        return self._live[name]

    def start(self, tasks: TaskSet) -> None:
        """Poll the routes' version in the background while `tasks` runs."""
        if self._configured:
            tasks.start(self._poll(), "route weights")

    async def _poll(self) -> None:
        await poll_version(
            self.refresh,
            _poll_failures,
            "routes_unread",
            "could not read the routes' weights (the last ones read still apply)",
        )


def _configured(name: str, config: RouteConfig) -> Route:
    targets = tuple(config.targets)
    return Route(name=name, targets=targets, weights=checked_weights(targets, config.targets))


async def poll_version(
    refresh: Callable[[], Awaitable[None]], failures: SummarizedLog, event: str, message: str
) -> None:
    """Call `refresh` every POLL_S until cancelled (`switchboard.tasks.poll`); a Redis outage fails
    every poll, so it is told now and then (`failures`), not twice a second, while the last state
    read still applies."""

    def told(exc: BaseException) -> None:
        failures.event(event, message, error=str(exc) or type(exc).__name__)

    await poll(refresh, POLL_S, message, first_wait=False, errors=(RedisError,), on_error=told)
