"""LoRA adapters registered at run time (the admin API, `switchboard adapters`), beside the config's.

A catalogue of thousands of fine-tunes does not live in the TOML: an operator registers each adapter
(its name, its base, where its files are) while the system runs, and removes it again. Registered
adapters live in Redis: `keys.adapters()` maps each name to the adapter's `[[models]]` entry, and
`keys.adapters_version()` is a token that every change replaces. Every front door and worker keeps
a copy in memory and polls the version every POLL_S (one GET); it reads the hash again only when the
version moved. So registered adapters cost Redis nothing while nobody registers any: the same one
GET per POLL_S and process with 10 of them as with 10,000, and a request never reads the registry.

An adapter is checked as the config's are at start (its base is a configured generator on vLLM or TensorRT-LLM, it
sets nothing that is its base's to set, its path is a folder or a store), and its base must take
adapters registered at run time: a `lora` table (the engine's LoRA settings are fixed when it
starts). A stored entry that does not fit this process's config (written by one with other models)
is left out, and logged.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import cast

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.config import ConfigError, ModelConfig
from switchboard.config.checks import check_adapter, check_location
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)

# How often a process looks for a change: a registration applies everywhere within about this.
POLL_S = 0.5
# Before the first read: unlike any version Redis answers, None (nothing registered yet) included.
_UNREAD = object()
_entry = msgspec.json.Decoder(ModelConfig)

# Told what changed: the adapters registered since, and the names removed since.
ChangeListener = Callable[[list[ModelConfig], list[str]], None]


class AdapterExists(Exception):
    """A name already registered, or taken by a configured model, route or pipeline."""


class AdapterRegistry:
    """The adapters registered at run time, as this process last read them from Redis."""

    def __init__(self, redis: aioredis.Redis, configured: Sequence[ModelConfig]) -> None:
        self._redis = redis
        self._configured = {model.name: model for model in configured}
        self._registered: dict[str, ModelConfig] = {}
        self._version: object = _UNREAD
        self._listeners: list[ChangeListener] = []

    def registered(self) -> Mapping[str, ModelConfig]:
        """Every registered adapter that fits this process's config, by name."""
        return self._registered

    def on_change(self, listener: ChangeListener) -> None:
        """Call `listener(added, removed)` after each read that changed the registered adapters."""
        self._listeners.append(listener)

    def checked(self, adapter: ModelConfig, taken: Iterable[str] = ()) -> ModelConfig:
        """`adapter` as it would be registered; ConfigError saying what is wrong with it, AdapterExists
        for a name in use (`taken`: names besides the models', such as routes and pipelines)."""
        name = adapter.name
        if name in self._configured or name in self._registered or name in set(taken):
            raise AdapterExists(f"the name {name!r} is taken; remove it first or choose another")
        if adapter.base is None:
            raise ConfigError(f"adapter {name!r}: `base` names the generator it is a LoRA adapter of")
        base = self._configured.get(adapter.base)
        check_adapter(adapter, base, list(self._configured))
        assert base is not None
        if base.lora is None:
            raise ConfigError(
                f"adapter {name!r}: base {base.name!r} takes no adapters registered at run time; give its "
                "[[models]] entry a [models.lora] table (its engine starts with LoRA enabled)"
            )
        check_location(adapter)
        return adapter

    async def add(self, adapter: ModelConfig, taken: Iterable[str] = ()) -> ModelConfig:
        """Register `adapter` (checked by `checked`), every process's within about POLL_S; AdapterExists
        when another process registered the name meanwhile."""
        self.checked(adapter, taken)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(keys.adapters(), adapter.name, msgspec.json.encode(adapter))
            pipe.set(keys.adapters_version(), uuid.uuid4().hex)
            added, _ = await pipe.execute()
        if not added:
            raise AdapterExists(f"the adapter {adapter.name!r} is registered already; remove it first")
        # Known here at once; the next poll reads the whole registry (once, however many are added).
        self._registered[adapter.name] = adapter
        return adapter

    async def remove(self, name: str) -> bool:
        """Remove the registered adapter `name`; whether one was registered."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.adapters(), name)
            pipe.set(keys.adapters_version(), uuid.uuid4().hex)
            removed, _ = await pipe.execute()
        self._registered.pop(name, None)
        return bool(removed)

    async def refresh(self) -> None:
        """Read the registered adapters again if their version moved (one GET when it did not)."""
        version = await self._redis.get(keys.adapters_version())
        if version == self._version:
            return
        stored = await self._redis.hgetall(keys.adapters())  # type: ignore[misc]
        fresh = self._fitting(cast(dict[bytes, bytes], stored))
        added = [adapter for name, adapter in fresh.items() if self._registered.get(name) != adapter]
        removed = [name for name, old in self._registered.items() if fresh.get(name) != old]
        self._registered = fresh
        self._version = version
        if added or removed:
            logger.info(
                f"registered adapters: {len(fresh)} ({len(added)} new, {len(removed)} removed)",
                extra={"added": [a.name for a in added[:20]], "removed": removed[:20]},
            )
            for listener in self._listeners:
                listener(added, removed)

    def start(self, tasks: TaskSet) -> None:
        """Poll the version in the background while `tasks` runs."""
        tasks.start(self._poll(), "registered adapters")

    async def _poll(self) -> None:
        await poll(
            self.refresh, POLL_S, "read the registered adapters", first_wait=False, errors=(RedisError,)
        )

    def _fitting(self, stored: Mapping[bytes, bytes]) -> dict[str, ModelConfig]:
        """The stored entries that fit this process's config; the others are logged and left out."""
        fitting: dict[str, ModelConfig] = {}
        for raw_name, payload in stored.items():
            name = raw_name.decode()
            try:
                adapter = _entry.decode(payload)
                if name in self._configured:
                    raise ConfigError("its name is a configured model's here")
                check_adapter(adapter, self._configured.get(adapter.base or ""), list(self._configured))
            except (msgspec.DecodeError, ConfigError) as exc:
                logger.warning(
                    "a registered adapter does not fit this process's config; left out",
                    extra={"adapter": name, "error": str(exc)},
                )
                continue
            fitting[name] = adapter
        return fitting
