"""Callers of API keys for tests that admit jobs without the front door: a key named `alice` is
known by the digest of its name, as if the name were its secret (its limits are kept under that)."""

from __future__ import annotations

from router.admission.auth import Caller
from switchboard import api_keys


def key_owner(name: str) -> str:
    """The identity of the test key `name` (`Caller.owner`)."""
    return api_keys.digest(name)


def key_caller(
    name: str,
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    max_parallel: int | None = None,
    tokens_per_day: int | None = None,
    tokens_per_month: int | None = None,
    team: str | None = None,
    team_tokens_per_day: int | None = None,
    team_tokens_per_month: int | None = None,
) -> Caller:
    """The caller of the test key `name`, with its limits, its token quotas and its team's."""
    return Caller(
        name=name,
        rpm=rpm,
        tpm=tpm,
        max_parallel=max_parallel,
        key_sha256=key_owner(name),
        tokens_per_day=tokens_per_day,
        tokens_per_month=tokens_per_month,
        team=team,
        team_tokens_per_day=team_tokens_per_day,
        team_tokens_per_month=team_tokens_per_month,
    )
