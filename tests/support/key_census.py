"""What Redis holds once traffic has stopped, family by family (`switchboard.keys`), and what is stray.

Families that describe the deployment live on: worker records and their index, replica leases, model
state (limits, measured costs, load failures, desired state), the demand stream and index, the
catalogue version, API keys and their rate buckets, routes and their version, the pipelines set
through the admin API and their version, a running front door's heartbeat and inbox, and each model's job stream, which must hold no job and nothing pending. What belongs to one request must be gone once it ended:
in-flight slots. Cancel marks are removed when their job ends, but a job given up after its client
left (`lua/give_up.lua`) while its worker was being killed may keep its mark until it expires, so
they are allowed with an expiry of at most `keys.CANCEL_TTL_S`. Result streams and job records
of a stream whose client left mid-way are kept for a resumption, with an expiry of at most
`keys.RESULT_TTL_S` (600 s, too long to wait for here), so they are allowed only with that expiry;
the token counters of quotas outlive their period by `keys.QUOTA_KEPT_S`, and are allowed with an
expiry of at most a month and that; a key without any expiry in those families, or of a family
`switchboard.keys` does not name, is stray.
"""

from __future__ import annotations

import fnmatch
import math
from collections import Counter
from dataclasses import dataclass, field

import redis

from router.routing.rollouts.judge import LEASE_MS
from switchboard import keys


def every_key_pattern() -> list[str]:
    """Globs covering every key Switchboard writes: all sit under its prefix (`switchboard.keys`)."""
    return [f"{keys.PREFIX}:*"]


# (family, glob); the first match names a key.
FAMILIES = [
    ("job stream", keys.job_stream("*")),
    ("job stream", keys.job_stream("*", "*")),  # a tier's other than default (`wire.TIERS`)
    ("replica lease", keys.replica_lease("*", "*")),  # type: ignore[arg-type]  (a glob: any replica)
    ("load failure", keys.load_failure("*")),
    ("desired state", keys.desired_state("*")),
    ("measured costs", keys.measured_costs("*", "*", "*")),
    ("model limits", keys.model_limits("*")),
    ("result stream", keys.result_stream("*")),
    ("cancel mark", keys.cancel_mark("*")),
    ("job record", keys.job_record("*")),  # after the job's other keys, which its glob also matches
    ("worker record", keys.worker_record("*")),
    ("workers index", keys.workers_index()),
    ("front door alive", keys.router_alive("*")),
    ("front door inbox", keys.inbox("*")),
    ("dead letters", keys.dead_letter_stream()),
    ("demand stream", keys.demand_stream()),
    ("demand index", keys.demand_index()),
    ("catalogue version", keys.catalogue_version()),
    ("api keys", keys.api_keys()),
    ("retired key names", keys.retired_key_names()),
    ("key rate", keys.key_rate("*")),
    ("key in flight", keys.key_in_flight("*")),
    ("key tokens", keys.key_tokens("*", "*")),
    ("team tokens", keys.team_tokens("*", "*")),
    ("in flight", keys.in_flight()),
    ("rollout lease", keys.rollout_lease("*")),
    ("rollout window", keys.rollout_window("*", "*", "*")),  # type: ignore[arg-type]
    ("shadow answers", keys.shadow_answers("*")),
    ("routes version", keys.routes_version()),
    ("pipelines", keys.pipelines()),
    ("pipelines version", keys.pipelines_version()),
    ("route", keys.route("*")),  # after the route families its glob also matches
]
LONG_LIVED = {
    "job stream",
    "replica lease",
    "load failure",
    "desired state",
    "measured costs",
    "model limits",
    "worker record",
    "workers index",
    "front door alive",
    "front door inbox",
    "demand stream",
    "demand index",
    "catalogue version",
    "api keys",
    "retired key names",
    "key rate",
    "route",
    "routes version",
    "pipelines",
    "pipelines version",
}
# Kept for a resumption, with an expiry of at most this long.
KEPT_WITH_TTL = {
    "result stream": keys.RESULT_TTL_S,
    "job record": keys.RESULT_TTL_S,
    "cancel mark": keys.CANCEL_TTL_S,
    "rollout lease": LEASE_MS // 1000,
    "rollout window": keys.ROLLOUT_WINDOW_TTL_S,
    "shadow answers": keys.SHADOW_ANSWERS_TTL_S,
    # A token quota's counter: its period (at most a month of 31 days), then QUOTA_KEPT_S.
    "key tokens": 31 * 24 * 3600 + keys.QUOTA_KEPT_S,
    "team tokens": 31 * 24 * 3600 + keys.QUOTA_KEPT_S,
}


@dataclass
class Census:
    """Keys by family, and the ones that should not be there."""

    families: Counter[str] = field(default_factory=Counter)
    strays: list[str] = field(default_factory=list)
    longest_ttl: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"  {'family':<18} {'keys':>4}  note"]
        for family, count in sorted(self.families.items()):
            note = "lives on" if family in LONG_LIVED else ""
            if family in self.longest_ttl:
                note = f"expires within {self.longest_ttl[family]} s"
            lines.append(f"  {family:<18} {count:>4}  {note}")
        lines.append(f"  strays: {self.strays or 'none'}")
        return "\n".join(lines)


def family_of(key: str) -> str | None:
    for family, pattern in FAMILIES:
        if fnmatch.fnmatchcase(key, pattern):
            return family
    return None


# Admission slots: released when their request ends, or expiring with their key by themselves.
SLOTS = {"in flight", "key in flight"}


def take_census(
    redis_url: str, slots_expire_within_s: float | None = None, deadlines_within_s: float = 0.0
) -> Census:
    """Every key under Switchboard's prefix, by family; strays described. With
    `slots_expire_within_s`, admission slots are allowed with an expiry at most that long (those of
    a front door that was killed, which nobody released: they expire at their job's deadline plus
    `keys.SLOT_GRACE_S`, too long to wait for). `deadlines_within_s`: how far the jobs' deadlines
    may still be; a job record nobody stepped away from lives until its deadline plus
    `keys.RESULT_TTL_S` (`switchboard.keys.job_record`), so it is allowed that much longer."""
    census = Census()
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        for pattern in every_key_pattern():
            for key in client.scan_iter(match=pattern, count=1000):
                family = family_of(key)
                # Milliseconds: a key in its last second (even its last millisecond, PTTL 0) reads
                # TTL 0 yet still expires by itself, and one that expired between the scan and this
                # read (-2) is simply gone.
                pttl = client.pttl(key)
                if pttl == -2:
                    continue
                ttl = -1 if pttl == -1 else math.ceil(pttl / 1000)
                if family is None:
                    census.strays.append(f"{key} (unknown family, ttl {ttl})")
                    continue
                census.families[family] += 1
                if family == "job stream":
                    length = client.xlen(key)
                    pending = client.xpending(key, keys.JOB_GROUP)["pending"] if length else 0
                    if length or pending:
                        census.strays.append(f"{key} holds {length} jobs, {pending} pending")
                elif family in KEPT_WITH_TTL or (family in SLOTS and slots_expire_within_s):
                    longest = KEPT_WITH_TTL.get(family) or slots_expire_within_s or 0
                    if family == "job record":
                        longest += deadlines_within_s
                    if not 0 <= ttl <= longest:  # -1: no expiry at all
                        census.strays.append(f"{key} (ttl {ttl})")
                    census.longest_ttl[family] = max(census.longest_ttl.get(family, 0), ttl)
                elif family not in LONG_LIVED:
                    census.strays.append(f"{key} (ttl {ttl})")
    return census


def clean(
    redis_url: str, slots_expire_within_s: float | None = None, deadlines_within_s: float = 0.0
) -> Census | None:
    """The census, if it found no stray key (for polling until the strays are gone)."""
    census = take_census(redis_url, slots_expire_within_s, deadlines_within_s)
    return None if census.strays else census
