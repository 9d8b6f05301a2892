"""What the policy may ask of a worker: the moves of one model slot, each with the reason why."""

from __future__ import annotations

import msgspec


class Load(msgspec.Struct, frozen=True, kw_only=True, tag="load"):
    """Load `model` here as replica number `replica` (its lease is taken before the load starts)."""

    model: str
    replica: int
    why: str


class Wake(msgspec.Struct, frozen=True, kw_only=True, tag="wake"):
    """Wake `model`, asleep here, back to warm."""

    model: str
    why: str


class Sleep(msgspec.Struct, frozen=True, kw_only=True, tag="sleep"):
    """Put `model`, warm and idle here, to sleep (it keeps its place but frees most memory)."""

    model: str
    why: str


class Unload(msgspec.Struct, frozen=True, kw_only=True, tag="unload"):
    """Unload `model` here: it stops taking jobs at once, finishes those in flight, then leaves."""

    model: str
    why: str
    # Set when the unload makes room for loading that model: it happens only if that load does.
    for_model: str | None = None


class Prefetch(msgspec.Struct, frozen=True, kw_only=True, tag="prefetch"):
    """Fetch the remote `model`'s files into this worker's node cache without loading it, so that a
    later load here (or on any worker of this node) skips the download."""

    model: str
    why: str


Action = Load | Wake | Sleep | Unload | Prefetch
