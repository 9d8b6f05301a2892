"""Who is calling: the API key of `Authorization: Bearer`, resolved to a Caller and its limits.

Auth is on when any key exists (in the config, in Redis, or the admin key) or `auth.required` is
set, and always on a front door that listens beyond loopback, unless `router.allow_open_access`:
removing the last key never opens such a door. With auth off (a loopback-only front door with no
keys, for local use) every request is the anonymous caller, which may do everything.

A key is found by the SHA-256 of the secret presented, in a table keyed by those digests: one
hash lookup, whatever the number of keys. Its timing says nothing about a stored key: a caller
chooses secrets, not digests, so how much of a stored digest its own matches is out of its reach
(and the table's hashing of the digests is seeded at random per process). The table of one front
door holds the config's keys and a copy of Redis's, re-read every `auth.cache_s`, so that a request
costs no Redis round trip for its key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from redis.exceptions import RedisError

from router.openai.errors import (
    AdminKeyRequiredError,
    AuthenticationError,
    ModelNotAllowedError,
    TierNotAllowedError,
)
from switchboard import api_keys, keys, tracing
from switchboard.config import ADMIN_KEY_NAME, ApiKey, ConfigError, Settings, TeamConfig
from switchboard.ports import is_loopback_host
from switchboard.wire import Tier

logger = logging.getLogger(__name__)

# Open whatever auth says: probes of load balancers and orchestrators carry no key.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


# The tiers a key that lists none may ask for: priority is only for keys that list it.
DEFAULT_TIERS = ("default", "flex")


@dataclass(frozen=True, slots=True)
class Caller:
    """The key a request came with, and what that key may do; `name` is None while auth is off.

    `key_sha256` is the key's identity: what it owns (its jobs) is the key's by that, never by
    `name`, which names the key in messages and logs and which a removed key leaves behind.
    """

    name: str | None
    # Models the key may use; empty: every model. A name ending in `*` is a prefix: `acme/*` is every
    # model whose name starts with `acme/` (a customer's fine-tunes, registered as they come).
    models: frozenset[str] = frozenset()
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    # The service tiers it may ask for (`ApiKey.service_tiers`); every tier while auth is off.
    service_tiers: frozenset[str] = frozenset(("priority", "default", "flex"))
    # Lines of its batches queued at once (`ApiKey.max_batch_lines_in_flight`); None: the runner's bound.
    max_batch_lines_in_flight: int | None = None
    admin: bool = False
    # The SHA-256 of the key's secret, as stored; None while auth is off.
    key_sha256: str | None = None
    # Token quotas per UTC day and month (`router.admission.quotas`): the key's own, and those of
    # its team (`auth.teams`), which its other keys share.
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    team: str | None = None
    team_tokens_per_day: int | None = None
    team_tokens_per_month: int | None = None

    def __post_init__(self) -> None:
        # A key's limits and jobs are kept under its identity: a named caller without one would share
        # them with the keyless caller.
        if self.name is not None and not self.key_sha256:
            raise ValueError(f"the caller of key {self.name!r} has no key_sha256")

    @property
    def counted(self) -> bool:
        """Whether its tokens are counted per day and month: it has a quota or a team."""
        own = self.tokens_per_day is not None or self.tokens_per_month is not None
        return self.key_sha256 is not None and (own or self.team is not None)

    @property
    def counts_tokens(self) -> bool:
        """Whether a request's tokens are reserved at admission: for tpm, or a quota's counters."""
        return bool(self.tpm) or self.counted

    @property
    def owner(self) -> str:
        """Who a job this caller sends belongs to: its key's identity ("" while auth is off)."""
        return self.key_sha256 or ""

    def may_use(self, model: str) -> bool:
        """Whether the key may send requests to `model`."""
        if not self.models or model in self.models:
            return True
        return any(allowed.endswith("*") and model.startswith(allowed[:-1]) for allowed in self.models)

    def require_tier(self, tier: Tier) -> None:
        """A 403 unless the key may ask for `tier` (a batch's lines run in theirs whoever sent them)."""
        if tier != "batch" and tier not in self.service_tiers:
            raise TierNotAllowedError(tier, self.name or "", sorted(self.service_tiers))

    def require_model(self, model: str) -> None:
        """A 403 unless the key may use `model`."""
        if not self.may_use(model):
            raise ModelNotAllowedError(model, self.name or "")


ANONYMOUS = Caller(name=None, admin=True)


def caller_for(key: ApiKey, teams: Mapping[str, TeamConfig] | None = None) -> Caller:
    """What a request with `key` may do; `teams`: the configured teams, whose quotas its team has."""
    team = (teams or {}).get(key.team or "", TeamConfig())
    return Caller(
        name=key.name,
        models=frozenset(key.models),
        rpm=key.rpm,
        tpm=key.tpm,
        max_parallel=key.max_parallel,
        service_tiers=frozenset(key.service_tiers or DEFAULT_TIERS),
        max_batch_lines_in_flight=key.max_batch_lines_in_flight,
        admin=key.admin,
        key_sha256=key.sha256,
        tokens_per_day=key.tokens_per_day,
        tokens_per_month=key.tokens_per_month,
        team=key.team,
        team_tokens_per_day=team.tokens_per_day,
        team_tokens_per_month=team.tokens_per_month,
    )


def auth_always_on(settings: Settings) -> bool:
    """Whether this front door asks for a key even while none exists."""
    exposed = not is_loopback_host(settings.router.host) and not settings.router.allow_open_access
    return settings.auth.required or exposed


def check_exposure(settings: Settings, stored_keys: int) -> None:
    """Refuse to serve beyond loopback with no key at all, unless the operator allowed open access."""
    router, auth = settings.router, settings.auth
    if is_loopback_host(router.host) or auth.required:
        return
    if stored_keys or auth.keys or auth.admin_key_sha256:
        return
    if router.allow_open_access:
        logger.warning(
            "serving without API keys on a non-loopback address: anyone who reaches it may use "
            "every model and the /admin endpoints (router.allow_open_access = true)",
            extra={"host": router.host, "port": router.port},
        )
        return
    raise ConfigError(
        f"router.host = {router.host!r} is reachable from other machines and no API key exists. "
        "Create one with `switchboard keys add NAME` (or list keys in the config as [[auth.keys]]), "
        "listen on 127.0.0.1, or set router.allow_open_access = true "
        "(SWITCHBOARD_ROUTER__ALLOW_OPEN_ACCESS=true) to serve everyone without keys."
    )


class KeyTable:
    """The keys one front door accepts, by SHA-256: the config's, and a copy of Redis's."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self._redis = redis
        self._cache_s = settings.auth.cache_s
        self._always_on = auth_always_on(settings)
        self._teams = settings.auth.teams
        self._configured = {bytes.fromhex(k.sha256): caller_for(k, self._teams) for k in settings.auth.keys}
        if settings.auth.admin_key_sha256:
            sha256 = settings.auth.admin_key_sha256
            admin = Caller(name=ADMIN_KEY_NAME, admin=True, key_sha256=sha256)
            self._configured[bytes.fromhex(sha256)] = admin
        # SHA-256 (raw bytes) → caller.
        self._callers: dict[bytes, Caller] = dict(self._configured)
        self._stored_count = 0
        self._loaded_at: float | None = None
        self._loading: asyncio.Task[None] | None = None

    @property
    def stored_count(self) -> int:
        """How many keys Redis held at the last read."""
        return self._stored_count

    async def load(self) -> None:
        """Read the stored keys now."""
        stored = cast(dict[bytes, bytes], await self._redis.hgetall(keys.api_keys()))
        records = api_keys.decode_stored(stored)
        stored_callers = {bytes.fromhex(k.sha256): caller_for(k, self._teams) for k in records}
        self._callers = {**stored_callers, **self._configured}
        self._stored_count = len(records)
        self._loaded_at = time.monotonic()

    async def resolve(self, authorization: str | None) -> Caller:
        """The caller presenting `authorization` (the header's value); 401 for a missing or unknown key."""
        await self._fresh()
        if not (self._always_on or self._callers):
            return ANONYMOUS
        secret = bearer_token(authorization)
        if secret is None:
            raise AuthenticationError(
                "You didn't provide an API key. Send it in an Authorization header as "
                "`Authorization: Bearer YOUR_KEY` (the openai client's api_key).",
                code="missing_api_key",
            )
        # One lookup by the digest: no key is compared with the secret, or with its digest, one by one.
        caller = self._callers.get(bytes.fromhex(api_keys.digest(secret)))
        if caller is None:
            raise AuthenticationError(
                f"Incorrect API key provided: {api_keys.mask(secret)}. "
                "Ask the operator of this Switchboard for a key (`switchboard keys add`)."
            )
        return caller

    def by_owner(self, owner: str) -> Caller | None:
        """The caller whose key's identity is `owner` ("" while auth is off), from the last read of the
        keys; None for a key removed since (work it left in the background acts for nobody)."""
        if not owner:
            return None if self._always_on or self._callers else ANONYMOUS
        return self._callers.get(bytes.fromhex(owner))

    async def _fresh(self) -> None:
        """Re-read the stored keys if the copy is older than `auth.cache_s`; one read at a time."""
        if self._loaded_at is not None and time.monotonic() - self._loaded_at < self._cache_s:
            return
        if self._loading is None:
            self._loading = asyncio.create_task(self._reload())
        loading = self._loading
        await asyncio.shield(loading)

    async def _reload(self) -> None:
        try:
            await self.load()
        except RedisError as exc:
            if self._loaded_at is None:
                raise
            # Keys cannot be read: keep serving the last copy rather than refuse everyone.
            logger.warning("could not re-read the API keys; using the last copy", extra={"error": str(exc)})
            self._loaded_at = time.monotonic()
        finally:
            self._loading = None


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Bearer <token>`, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def caller_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Caller:
    """The request's caller, resolved once per request and kept on its state."""
    caller: Caller | None = connection.state.get("caller")
    if caller is None:
        table: KeyTable = connection.app.state.front_door.key_table
        with tracing.span("switchboard.authenticate"):
            caller = await table.resolve(connection.headers.get("authorization"))
        connection.state.caller = caller
    return caller


async def authenticate(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """App-wide guard: every route but the health checks needs a known key while auth is on."""
    if connection.scope["path"] not in PUBLIC_PATHS:
        await caller_of(connection)


async def require_admin(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard of the /admin endpoints: an admin key while auth is on."""
    if not (await caller_of(connection)).admin:
        raise AdminKeyRequiredError("This endpoint needs an admin key (`switchboard keys add NAME --admin`).")


async def provide_caller(request: Request[Any, Any, Any]) -> Caller:
    """The `caller` dependency of the request handlers."""
    return await caller_of(request)
