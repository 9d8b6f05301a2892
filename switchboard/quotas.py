"""Token quotas of API keys and teams: the UTC day and month they count in, their counters, and
what a key's or a team's usage reads as (`GET /admin/usage`, `switchboard keys usage`).

A key with a quota (`tokens_per_day`, `tokens_per_month`) or a team is counted: every request's
tokens go on its key's counters of the day and of the month, and on its team's. The front door
reserves a request's estimate on them as it admits it and settles them with what it used when it
ends (`router.admission.quotas`), so a counter reads what was used, plus what the requests in
flight reserved. A key with neither costs Redis nothing more.

A period is a UTC calendar day or month, and each has counters of its own (`keys.key_tokens`,
`keys.team_tokens`, named by the period: `day:2025-01-31`, `month:2025-01`): a period starts from
nothing at 00:00 UTC (on the 1st, for a month), and the counters of one that ended expire
`keys.QUOTA_KEPT_S` later. A request counts in the period its front door's clock is in when it is
admitted, and is settled there whenever it ends: only a request admitted within the front doors'
clock skew of midnight may count in the day on either side.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from switchboard import keys
from switchboard.config import ApiKey, TeamConfig


@dataclass(frozen=True, slots=True)
class Periods:
    """The quota periods one moment falls in: its UTC day and month, and when each ends."""

    day: str  # `day:2025-01-31`
    month: str  # `month:2025-01`
    day_ends: float  # unix seconds
    month_ends: float

    @classmethod
    def at(cls, now: float) -> Periods:
        """The periods of the moment `now` (unix seconds)."""
        # A UTC day has 86,400 unix seconds (leap seconds are not counted in unix time).
        return _periods_of_day(int(now // 86400))


@functools.lru_cache(maxsize=4)
def _periods_of_day(day: int) -> Periods:
    """The periods of UTC day number `day` since the epoch: computed once a day, not per request."""
    day_start = datetime.datetime.fromtimestamp(day * 86400, datetime.UTC)
    month_start = day_start.replace(day=1)
    # 32 days past the 1st is always in the next month, whatever this one's length.
    next_month = (month_start + datetime.timedelta(days=32)).replace(day=1)
    return Periods(
        day=f"day:{day_start:%Y-%m-%d}",
        month=f"month:{month_start:%Y-%m}",
        day_ends=(day_start + datetime.timedelta(days=1)).timestamp(),
        month_ends=next_month.timestamp(),
    )


def iso_time(unix_s: float) -> str:
    """`unix_s` as an ISO 8601 UTC time, as quota messages and usage say when a period resets."""
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Counted:
    """A key or a team, as its usage is read: whose counters, within which quotas."""

    kind: Literal["key", "team"]
    name: str
    # What its counters are kept under (a key's identity, a team's name); None: it is not counted
    # (a key without quota or team).
    counted_as: str | None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    # A key's team.
    team: str | None = None

    def counters(self, periods: Periods) -> tuple[str, str]:
        """Its counters of the day and the month of `periods` (names only: nothing is read)."""
        counter = keys.key_tokens if self.kind == "key" else keys.team_tokens
        return counter(self.counted_as or "", periods.day), counter(self.counted_as or "", periods.month)


def counted_key(key: ApiKey) -> Counted:
    """The key `key`, counted if it has a quota or a team."""
    counted = key.tokens_per_day is not None or key.tokens_per_month is not None or key.team is not None
    return Counted(
        kind="key",
        name=key.name,
        counted_as=key.sha256 if counted else None,
        tokens_per_day=key.tokens_per_day,
        tokens_per_month=key.tokens_per_month,
        team=key.team,
    )


def counted_team(name: str, teams: Mapping[str, TeamConfig]) -> Counted:
    """The team `name`, within its quotas in `teams` (none for a team only keys name)."""
    config = teams.get(name, TeamConfig())
    return Counted(
        kind="team",
        name=name,
        counted_as=name,
        tokens_per_day=config.tokens_per_day,
        tokens_per_month=config.tokens_per_month,
    )


def everyone_counted(api_keys: Iterable[ApiKey], teams: Mapping[str, TeamConfig]) -> list[Counted]:
    """Every counted key (with a quota or a team), by name, then every team (configured, or named by
    a key), by name."""
    api_keys = list(api_keys)
    counted = sorted((c for c in map(counted_key, api_keys) if c.counted_as), key=lambda c: c.name)
    team_names = sorted(set(teams) | {k.team for k in api_keys if k.team is not None})
    return counted + [counted_team(name, teams) for name in team_names]


class PeriodUsage(msgspec.Struct, kw_only=True):
    """One period's counter as read: tokens used, requests in flight counted at their estimate."""

    period: str  # `2025-01-31`, `2025-01`
    # None: not counted (a key without quota or team).
    used: int | None
    # The quota; None: none.
    limit: int | None
    # When the period ends and a new count starts (ISO 8601, UTC).
    resets_at: str


class QuotaUsage(msgspec.Struct, kw_only=True):
    """A key's or a team's tokens this UTC day and month, with its quotas."""

    name: str
    kind: Literal["key", "team"]
    day: PeriodUsage
    month: PeriodUsage
    # A key's team (None for a team, or a key without one).
    team: str | None = None
    object: Literal["usage"] = "usage"


class UsageList(msgspec.Struct, kw_only=True):
    """Body of `GET /admin/usage`."""

    data: list[QuotaUsage]
    object: Literal["list"] = "list"


def counter_keys(counted: Iterable[Counted], periods: Periods) -> list[str]:
    """The counters to read for `counted`'s usage: two each (day, month), in order."""
    return [name for one in counted for name in one.counters(periods)]


def usage_of(
    counted: list[Counted], periods: Periods, values: Sequence[bytes | str | None]
) -> list[QuotaUsage]:
    """The usage of each of `counted`, from the values of its `counter_keys` as read (one MGET)."""
    usages = []
    for index, one in enumerate(counted):
        day, month = values[2 * index], values[2 * index + 1]
        usages.append(
            QuotaUsage(
                name=one.name,
                kind=one.kind,
                team=one.team,
                day=_period_usage(one, periods.day, day, one.tokens_per_day, periods.day_ends),
                month=_period_usage(one, periods.month, month, one.tokens_per_month, periods.month_ends),
            )
        )
    return usages


def _period_usage(
    one: Counted, period: str, value: bytes | str | None, limit: int | None, ends: float
) -> PeriodUsage:
    # A counter not written yet: nothing was used in the period.
    used = None if one.counted_as is None else max(0, int(value or 0))
    return PeriodUsage(period=period.partition(":")[2], used=used, limit=limit, resets_at=iso_time(ends))
