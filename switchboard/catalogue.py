"""The catalogue version: one counter that moves whenever a slow-changing fact changes.

Measured costs (load, wake, sleep, memory), load failures and operator requests (desired states)
change rarely, and every controller pass needs them for the models it weighs. Whoever changes one
bumps the version in the same pipeline (`bump_catalogue`); a controller keeps the facts it read
and reads them again only when the version moved (and, because an expiry bumps nothing, at a slow
safety interval).
"""

from __future__ import annotations

from redis.asyncio.client import Pipeline

from switchboard import keys


def bump_catalogue(pipe: Pipeline) -> None:
    """Add to `pipe`: the catalogue changed. Queue it after the change itself."""
    pipe.incr(keys.catalogue_version())
    pipe.expire(keys.catalogue_version(), keys.CATALOGUE_VERSION_TTL_S)
