"""API keys: a secret shown once, kept only as its SHA-256, with the key's limits next to it.

Secrets are long random tokens (`secrets.token_urlsafe(32)`, 256 bits), so a plain SHA-256 is
enough to store them: there is no password to guess. `switchboard keys` keeps them in one Redis
hash (`keys.api_keys()`: SHA-256 → the `ApiKey` record as JSON, readable with redis-cli); the
config can list more as `[[auth.keys]]`. Both sides of the product read them through this module.

A key is known by its SHA-256: what it owns (the jobs it sent) is its own by that. Its name is what
people read in messages, logs and traces, so one name means one key for good: a new key may not
take a reserved name (`config.RESERVED_KEY_NAMES`), nor the name of a key that exists or was removed (those
are kept in `keys.retired_key_names()`), compared without regard to case.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

import msgspec
import redis

from switchboard import keys
from switchboard.config import RESERVED_KEY_NAMES, ApiKey

logger = logging.getLogger(__name__)

# Recognisable in logs and secret scanners, like OpenAI's `sk-`.
SECRET_PREFIX = "sb-"

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ApiKey)


class KeyExistsError(ValueError):
    """A key of that name exists already, existed once, or the name is reserved."""


def check_name_free(name: str, *, taken: set[str], retired: set[str]) -> None:
    """KeyExistsError unless a new key may be called `name`: not reserved, not the name of a key in
    `taken` (existing) or `retired` (removed), whatever the case of its letters."""
    folded = name.casefold()
    if folded in RESERVED_KEY_NAMES:
        raise KeyExistsError(
            f"the name {name!r} is reserved (it names the admin key given as auth.admin_key_sha256, "
            "or requests while auth is off); choose another name"
        )
    if folded in {n.casefold() for n in taken}:
        raise KeyExistsError(f"a key named {name!r} exists already; choose another name")
    if folded in {n.casefold() for n in retired}:
        raise KeyExistsError(
            f"a key named {name!r} existed and was removed; names are not reused, so that logs and "
            "traces that name it mean one key. Choose another name (say, with a suffix: "
            f"{name}-2)"
        )


def new_secret() -> str:
    """A new API key secret."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """The SHA-256 (hex) under which a secret is stored and looked up."""
    return hashlib.sha256(secret.encode()).hexdigest()


def mask(secret: str) -> str:
    """Enough of a secret for its owner to recognise it, not enough to use it: `sb-Ab***xyz9`."""
    if len(secret) < 12:
        return "***"
    return f"{secret[:5]}***{secret[-4:]}"


def encode_record(key: ApiKey) -> bytes:
    """The JSON stored in Redis for `key`."""
    return _encoder.encode(key)


def decode_stored(stored: Mapping[bytes, bytes]) -> list[ApiKey]:
    """The records of the Redis hash of keys; one that does not decode is left out with a warning."""
    records = []
    for field, value in stored.items():
        try:
            record = _decoder.decode(value)
        except msgspec.ValidationError as exc:
            logger.warning("an API key record in Redis is invalid; ignored", extra={"error": str(exc)})
            continue
        # The field is what lookups use: a record edited by hand cannot claim another hash.
        sha256 = field.decode(errors="replace")
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            logger.warning(
                "an API key in Redis is not stored under a SHA-256; ignored", extra={"key": record.name}
            )
            continue
        records.append(msgspec.structs.replace(record, sha256=sha256))
    return records


class KeyStore:
    """The API keys kept in Redis, as `switchboard keys` manages them (blocking client)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def all(self) -> list[ApiKey]:
        """Every stored key, by name."""
        stored: dict[bytes, bytes] = self._redis.hgetall(keys.api_keys())  # type: ignore[assignment]
        return sorted(decode_stored(stored), key=lambda k: k.name)

    def add(
        self,
        name: str,
        *,
        models: list[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        max_parallel: int | None = None,
        tokens_per_day: int | None = None,
        tokens_per_month: int | None = None,
        team: str | None = None,
        service_tiers: list[str] | None = None,
        max_batch_lines_in_flight: int | None = None,
        admin: bool = False,
        taken_names: set[str] | None = None,
    ) -> tuple[str, ApiKey]:
        """Make and store a new key; returns its secret (shown once, never stored) and its record.

        KeyExistsError if `name` is reserved, or names a key stored, in `taken_names` (the config's),
        or removed. The check and the write are one transaction: two `keys add` of one name at once
        store one key.
        """
        secret, record = make_key(
            name,
            models=models,
            rpm=rpm,
            tpm=tpm,
            max_parallel=max_parallel,
            tokens_per_day=tokens_per_day,
            tokens_per_month=tokens_per_month,
            team=team,
            service_tiers=service_tiers,
            max_batch_lines_in_flight=max_batch_lines_in_flight,
            admin=admin,
        )
        with self._redis.pipeline() as pipe:
            pipe.watch(keys.api_keys(), keys.retired_key_names())
            stored: dict[bytes, bytes] = pipe.hgetall(keys.api_keys())  # type: ignore[assignment]
            retired: set[bytes] = pipe.smembers(keys.retired_key_names())  # type: ignore[assignment]
            check_name_free(
                name,
                taken={k.name for k in decode_stored(stored)} | (taken_names or set()),
                retired={n.decode(errors="replace") for n in retired},
            )
            pipe.multi()
            pipe.hset(keys.api_keys(), record.sha256, encode_record(record))
            pipe.execute()  # WatchError if another `keys add` or `keys remove` ran meanwhile
        return secret, record

    def update(self, name: str, changes: Mapping[str, Any]) -> ApiKey | None:
        """Change fields of the stored key called `name` (its limits, quotas, team: `ApiKey`'s
        fields, None to remove one); its new record, or None if no key of that name is stored.

        ValueError for a value the record cannot take. Read and written in one transaction
        (WatchError if another `switchboard keys` command changed the keys meanwhile).
        """
        with self._redis.pipeline() as pipe:
            pipe.watch(keys.api_keys())
            stored: dict[bytes, bytes] = pipe.hgetall(keys.api_keys())  # type: ignore[assignment]
            record = next((k for k in decode_stored(stored) if k.name == name), None)
            if record is None:
                return None
            changed = _validated({**msgspec.structs.asdict(record), **changes})
            pipe.multi()
            pipe.hset(keys.api_keys(), changed.sha256, encode_record(changed))
            pipe.execute()
        return changed

    def remove(self, name: str) -> bool:
        """Remove the key called `name`, whose name no new key may take; False if there is none."""
        hashes = [k.sha256 for k in self.all() if k.name == name]
        if hashes:
            pipe = self._redis.pipeline()
            pipe.hdel(keys.api_keys(), *hashes)
            pipe.sadd(keys.retired_key_names(), name)
            pipe.execute()
        return bool(hashes)


def make_key(
    name: str,
    *,
    models: list[str] | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    max_parallel: int | None = None,
    tokens_per_day: int | None = None,
    tokens_per_month: int | None = None,
    team: str | None = None,
    service_tiers: list[str] | None = None,
    max_batch_lines_in_flight: int | None = None,
    admin: bool = False,
) -> tuple[str, ApiKey]:
    """A new secret and its validated record (nothing stored)."""
    secret = new_secret()
    raw = {
        "name": name,
        "sha256": digest(secret),
        "models": models or [],
        "rpm": rpm,
        "tpm": tpm,
        "max_parallel": max_parallel,
        "tokens_per_day": tokens_per_day,
        "tokens_per_month": tokens_per_month,
        "team": team,
        "service_tiers": service_tiers or [],
        "max_batch_lines_in_flight": max_batch_lines_in_flight,
        "admin": admin,
        "created": time.time(),
    }
    return secret, _validated(raw)


def _validated(raw: Mapping[str, Any]) -> ApiKey:
    """The record `raw` holds, checked as the config's keys are; ValueError if it is no valid key."""
    try:
        return msgspec.convert(raw, ApiKey)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid key: {exc}") from exc
