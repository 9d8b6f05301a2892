"""Serve the front door with uvicorn (uvloop and httptools where installed)."""

from __future__ import annotations

import uvicorn
from litestar import Litestar
from redis.exceptions import RedisError

from router.admission.auth import check_exposure
from router.app import create_app
from router.http.connection_limits import ConnectionLimits
from router.http.connections import guarded_protocol
from switchboard import gc_heap, keys
from switchboard.config import Settings
from switchboard.redis_conn import sync_client
from switchboard.tracing import configure_tracing


def serve(settings: Settings) -> None:
    """Entry point of `switchboard router`; returns when the server stops.

    Raises ConfigError before listening when the front door would serve other machines without
    any API key (the app checks again as it starts; this says so without a traceback).
    """
    configure_tracing("switchboard-router")
    stored_keys = _stored_key_count(settings)
    # With open access allowed there is nothing to refuse; the app logs its warning as it starts.
    if stored_keys is not None and not settings.router.allow_open_access:
        check_exposure(settings, stored_keys)
    app = create_app(settings)
    # What start-up made lives as long as the process: full collections need not walk it.
    gc_heap.freeze_long_lived()
    gc_heap.observe_pauses()
    uvicorn.Server(server_config(app, settings)).run()


def server_config(app: Litestar, settings: Settings, *, port: int | None = None) -> uvicorn.Config:
    """uvicorn's settings for the front door: its address, and the limits on slow and idle clients
    (`router.http.connections`); `port` overrides the configured one (0: any free port)."""
    router = settings.router
    return uvicorn.Config(
        app,
        host=router.host,
        port=router.port if port is None else port,
        access_log=False,
        log_level="warning",
        http=guarded_protocol(ConnectionLimits.of(router)),
        # No WebSocket endpoint: an upgrade request is answered as plain HTTP.
        ws="none",
        # uvicorn declares whole seconds but only ever waits with it: fractions work.
        timeout_keep_alive=router.keep_alive_timeout_s,  # type: ignore[arg-type]
    )


def _stored_key_count(settings: Settings) -> int | None:
    """How many API keys Redis holds; None when Redis cannot say."""
    if not settings.redis.url:
        return None
    try:
        with sync_client(settings.redis.url, timeout_s=5) as client:
            return int(client.hlen(keys.api_keys()))  # type: ignore[arg-type]
    except RedisError:
        return None
