"""Who may call the front door (`[auth]`): API keys, known by the SHA-256 of their secrets, with
their limits, and the names no key may take."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from switchboard.config.limits import PositiveLimit

Sha256Hex = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
# Key names the product gives itself, which no key may take in any case of its letters: the admin
# key given as `auth.admin_key_sha256`, and requests while auth is off.
ADMIN_KEY_NAME = "admin"
OPEN_ACCESS_NAME = "anonymous"
RESERVED_KEY_NAMES = frozenset({ADMIN_KEY_NAME, OPEN_ACCESS_NAME})
KeyName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._@-]+$")]
# A team of keys that share token quotas (`[auth.teams.NAME]`): a name like a key's.
TeamName = KeyName


class ApiKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One API key, known by the SHA-256 of its secret (`switchboard keys add` makes both).

    The same record lives in the config (`[[auth.keys]]`) or in Redis (`switchboard keys add`).
    """

    name: KeyName
    sha256: Sha256Hex
    # Models the key may use; empty: every model.
    models: list[str] = msgspec.field(default_factory=list)
    # Requests and tokens (prompt and completion) per minute, requests in flight at once; None: no limit.
    rpm: PositiveLimit | None = None
    tpm: PositiveLimit | None = None
    max_parallel: PositiveLimit | None = None
    # The service tiers its requests may ask for (`service_tier`); empty: default and flex (auto is
    # default). Priority, ahead of every default job, is only for keys that list it.
    service_tiers: list[Literal["priority", "default", "flex"]] = msgspec.field(default_factory=list)
    # Tokens (prompt and completion) per UTC calendar day, counted across the front doors; None: no
    # quota. A request is refused (429 `quota_exceeded`) unless its estimate fits what is left.
    tokens_per_day: PositiveLimit | None = None
    # Tokens per UTC calendar month, the same way; None: no quota.
    tokens_per_month: PositiveLimit | None = None
    # The team whose quotas (`[auth.teams.NAME]`) the key shares with the team's other keys; None: none.
    # A key with a team or a quota has its tokens counted (`switchboard keys usage`).
    team: TeamName | None = None
    # Lines of the key's batches run at once, across its batches; None: the runner's own bound.
    max_batch_lines_in_flight: PositiveLimit | None = None
    # May call the /admin endpoints.
    admin: bool = False
    created: float | None = None


class TeamConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The token quotas a team of keys shares (`[auth.teams.NAME]`): every key whose `team` names it
    counts against them, beside its own."""

    # Tokens (prompt and completion) per UTC calendar day for the team's keys together; None: no
    # quota (the team's tokens are still counted).
    tokens_per_day: PositiveLimit | None = None
    # Tokens per UTC calendar month for the team's keys together; None: no quota.
    tokens_per_month: PositiveLimit | None = None


class AuthConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who may call the front door: `Authorization: Bearer <key>` once any key exists."""

    # Ask for a key even while none exists (every request is then refused).
    required: bool = False
    # Keys kept in the config; `switchboard keys add` keeps them in Redis instead.
    keys: list[ApiKey] = msgspec.field(default_factory=list)
    # Teams of keys and their shared token quotas, by name; a key joins one with its `team`.
    teams: dict[TeamName, TeamConfig] = msgspec.field(default_factory=dict)
    # SHA-256 of an admin key given outside the config file (SWITCHBOARD_AUTH__ADMIN_KEY_SHA256).
    admin_key_sha256: Sha256Hex | None = None
    # How long a front door trusts its copy of the keys in Redis: a removed key works this much longer.
    cache_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
