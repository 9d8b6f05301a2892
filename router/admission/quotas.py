"""Token quotas at admission: the counters a request reserves its tokens on, and the 429 of a quota
it would exceed.

A counted key's request (`Caller.counted`: a key with a quota or a team) reserves its estimate on
four counters (`switchboard.quotas`): its key's of the UTC day and of the month, and its team's. It
is admitted only if, on each counter with a quota, what is used and reserved plus its estimate
stays within the quota. The check and the reservation are part of admission's own script
(`switchboard/lua/admit.lua`), in the same round trip as the rest of admission, and Redis runs one
script at a time: however many front doors admit a key's requests at once, no two reserve the same
tokens. The request is settled at release (`release.lua`) on the counters it reserved on, those of
the periods it was admitted in, with the tokens it used (`router.admission.charges`).

The quota holds as exactly as the estimate bounds what a request uses: a request is settled with
the tokens its engine counted, which may pass its estimate (its prompt is estimated at characters /
4; without `max_tokens`, its answer at `limits.estimated_completion_tokens`). A counter may then
pass its quota by that much, and the key's next requests are refused until the period ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.admission.auth import Caller
from router.openai.errors import TooManyRequestsError
from switchboard import keys
from switchboard.quotas import Periods, iso_time

# admit.lua's refusals of a quota, in the order of its counters (KEYS[5..8]).
QUOTA_REFUSALS = ("quota_key_day", "quota_key_month", "quota_team_day", "quota_team_month")
# A counter's quota as admit.lua reads it: counted without a quota, or not counted at all.
NO_QUOTA = 0
NOT_COUNTED = -1


@dataclass(frozen=True, slots=True)
class QuotaHold:
    """The counters one request reserves its tokens on (admit.lua's KEYS[5..8]), with their quotas:
    the key's of the day and the month, then its team's."""

    periods: Periods
    counters: tuple[str, str, str, str]
    # NO_QUOTA: counted without a quota; NOT_COUNTED: never read or written.
    quotas: tuple[int, int, int, int]

    @classmethod
    def of(cls, caller: Caller, now: float) -> QuotaHold:
        """What `caller`'s request admitted at `now` (unix seconds) reserves on."""
        periods = Periods.at(now)
        if not caller.counted:
            # admit.lua takes four counters whatever the key: these names are never read or written.
            unused = keys.key_rate(caller.owner)
            return cls(periods, (unused,) * 4, (NOT_COUNTED,) * 4)
        owner = caller.owner
        key_day, key_month = keys.key_tokens(owner, periods.day), keys.key_tokens(owner, periods.month)
        own = (_quota(caller.tokens_per_day), _quota(caller.tokens_per_month))
        if caller.team is None:
            return cls(periods, (key_day, key_month, key_day, key_month), (*own, NOT_COUNTED, NOT_COUNTED))
        team_day = keys.team_tokens(caller.team, periods.day)
        team_month = keys.team_tokens(caller.team, periods.month)
        team = (_quota(caller.team_tokens_per_day), _quota(caller.team_tokens_per_month))
        return cls(periods, (key_day, key_month, team_day, team_month), (*own, *team))

    def admit_keys(self) -> list[str]:
        """admit.lua's KEYS[5..8]."""
        return list(self.counters)

    def admit_args(self) -> list[str | int]:
        """admit.lua's ARGV[10..16]: the quotas, when the periods end, how long counters are kept."""
        ends = [round(self.periods.day_ends), round(self.periods.month_ends)]
        return [*self.quotas, *ends, keys.QUOTA_KEPT_S]

    def settled(self) -> list[str]:
        """release.lua's KEYS[4..]: the counters the request reserved on, which its usage settles."""
        return [
            counter for counter, quota in zip(self.counters, self.quotas, strict=True) if quota != NOT_COUNTED
        ]

    def refused(
        self, what: str, retry_after_s: float, used: int, caller: Caller, tokens: int
    ) -> TooManyRequestsError:
        """The 429 of admit.lua's refusal `what` (one of QUOTA_REFUSALS), its counter holding `used`."""
        which = QUOTA_REFUSALS.index(what)
        whose = f"key `{caller.name}`" if which < 2 else f"team `{caller.team}` (of key `{caller.name}`)"
        period, ends = (
            ("day", self.periods.day_ends) if which % 2 == 0 else ("month", self.periods.month_ends)
        )
        limit = self.quotas[which]
        message = (
            f"Quota reached for {whose} on tokens per {period} (UTC): limit {limit}, {used} used or "
            f"reserved, this request counts about {tokens}. It resets at {iso_time(ends)}."
        )
        if tokens > limit:
            message += " This request alone counts more than the whole quota: lower its max_tokens."
        return TooManyRequestsError(message, retry_after_s=retry_after_s, code="quota_exceeded", tokens=True)


def _quota(limit: int | None) -> int:
    return NO_QUOTA if limit is None else limit
