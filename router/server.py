"""Serve the front door with uvicorn (uvloop and httptools where installed)."""

from __future__ import annotations

import uvicorn

from router.app import create_app
from switchboard.config import Settings


def serve(settings: Settings) -> None:
    """Entry point of `switchboard router`; returns when the server stops."""
    uvicorn.run(
        create_app(settings),
        host=settings.router.host,
        port=settings.router.port,
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
    )
