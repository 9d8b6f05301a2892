"""`switchboard keys add | set | list | usage | remove`: API keys kept in Redis, or printed for the
config file, and the tokens keys and teams used.

A new key's secret is printed once, alone on stdout (so `KEY=$(switchboard keys add NAME)` works);
only its SHA-256 is kept. Everything else goes to stderr. `keys usage` reads the token counters of
the key quotas (`switchboard.quotas`) as `GET /admin/usage` does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Any

import msgspec
import redis
from redis.exceptions import RedisError, WatchError

from switchboard import api_keys, keys, quotas
from switchboard.config import ApiKey, Settings
from switchboard.redis_address import describe
from switchboard.redis_conn import sync_client

NO_REDIS = (
    "keys are kept in Redis, and no Redis is configured (set REDIS_URL or redis.url). "
    "`switchboard up` without REDIS_URL runs a private Redis that keeps nothing: list keys in the "
    "config instead, as `switchboard keys add NAME --toml` prints them."
)
COLUMNS = (
    "NAME",
    "MODELS",
    "RPM",
    "TPM",
    "PARALLEL",
    "TOKENS/DAY",
    "TOKENS/MONTH",
    "TEAM",
    "ADMIN",
    "CREATED",
    "KEPT IN",
)
USAGE_COLUMNS = ("NAME", "KIND", "TEAM", "DAY USED", "DAY QUOTA", "MONTH USED", "MONTH QUOTA")
# `keys set`'s word for "no limit" (or no team).
NONE = "none"


def add_parser(commands: Any) -> None:
    """The `keys` command and its subcommands, on the CLI's subparsers."""
    parser = commands.add_parser("keys", help="API keys: add (prints the key once), set, list, usage, remove")
    actions = parser.add_subparsers(dest="keys_command", required=True)
    add = actions.add_parser("add", help="make a key, store its SHA-256 in Redis and print the key once")
    add.add_argument(
        "name",
        help="who or what the key is for (letters, digits, '.', '_', '@', '-'); not 'admin' or "
        "'anonymous', nor the name of a key that exists or was removed",
    )
    add.add_argument(
        "--models",
        dest="key_models",
        type=_names,
        default=[],
        help="comma-separated models it may use (default: all); `acme/*` is every model named acme/...",
    )
    _limit_options(add, _positive_int, "default: no limit")
    add.add_argument("--team", help="the team whose token quotas it shares ([auth.teams.NAME])")
    add.add_argument(
        "--service-tiers",
        type=_names,
        help="comma-separated service tiers it may ask for, of priority, default, flex (default: default,flex)",
    )
    add.add_argument("--admin", action="store_true", help="may also call the /admin endpoints")
    add.add_argument(
        "--toml",
        action="store_true",
        help="print an [[auth.keys]] entry for the config instead of storing it",
    )
    change = actions.add_parser(
        "set",
        help="change a key's limits, quotas or team in Redis (front doors apply it within auth.cache_s)",
    )
    change.add_argument("name")
    _limit_options(change, _limit_or_none, f"`{NONE}`: no limit; left out: unchanged")
    change.add_argument("--team", help=f"the team whose token quotas it shares (`{NONE}`: no team)")
    change.add_argument(
        "--service-tiers",
        help=f"comma-separated service tiers it may ask for (`{NONE}`: default and flex)",
    )
    actions.add_parser("list", help="the keys in Redis and in the config (never their secrets)")
    usage = actions.add_parser(
        "usage", help="tokens used this UTC day and month by the keys with a quota or a team, and the teams"
    )
    usage.add_argument("name", nargs="?", help="one key or team (default: every key counted, every team)")
    usage.add_argument("--json", action="store_true", help="print what GET /admin/usage answers")
    remove = actions.add_parser(
        "remove", help="remove a key from Redis (front doors notice within auth.cache_s)"
    )
    remove.add_argument("name")


def _limit_options(parser: argparse.ArgumentParser, value: Any, default: str) -> None:
    """The options of a key's limits and token quotas, read by `value`."""
    parser.add_argument("--rpm", type=value, help=f"requests per minute ({default})")
    parser.add_argument("--tpm", type=value, help=f"tokens per minute, prompt and completion ({default})")
    parser.add_argument("--parallel", type=value, help=f"requests in flight at once ({default})")
    parser.add_argument(
        "--tokens-per-day", type=value, help=f"tokens per UTC day, prompt and completion ({default})"
    )
    parser.add_argument("--tokens-per-month", type=value, help=f"tokens per UTC calendar month ({default})")
    parser.add_argument(
        "--batch-lines",
        type=value,
        help=f"lines of its batches queued at once ({default}: the runner's bound)",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run one `keys` subcommand; the process's exit code."""
    if args.keys_command == "add" and args.toml:
        return _print_toml(args, settings)
    if not settings.redis.url:
        if args.keys_command == "list":
            print(render_table([], settings.auth.keys), end="")
        _say(NO_REDIS)
        return 0 if args.keys_command == "list" else 2
    try:
        with sync_client(settings.redis.url, timeout_s=10) as client:
            store = api_keys.KeyStore(client)
            if args.keys_command == "add":
                return _add(store, args, settings)
            if args.keys_command == "remove":
                return _remove(store, args.name, settings)
            if args.keys_command == "set":
                return _set(store, args, settings)
            if args.keys_command == "usage":
                return _usage(client, store, args, settings)
            print(render_table(store.all(), settings.auth.keys), end="")
            return 0
    except RedisError as exc:
        _say(f"cannot reach Redis at {describe(settings.redis.url)}: {exc}")
        return 1


def _add(store: api_keys.KeyStore, args: argparse.Namespace, settings: Settings) -> int:
    _warn_unknown_models(args.key_models, settings)
    _warn_unknown_team(args.team, settings)
    try:
        secret, record = store.add(
            args.name, **_limits_of(args), taken_names={k.name for k in settings.auth.keys}
        )
    except ValueError as exc:
        _say(str(exc))
        return 1
    except WatchError:
        _say(
            "another `switchboard keys` command changed the keys meanwhile; nothing was stored, run it again"
        )
        return 1
    print(secret, flush=True)
    _say(
        f"key {record.name!r} stored in Redis (key prefix {keys.PREFIX!r}): {_limits(record)}. "
        "This is the only time it is shown; callers send it as `Authorization: Bearer <key>` "
        "(the openai client's api_key)."
    )
    return 0


def _limits_of(args: argparse.Namespace) -> dict[str, Any]:
    """What `keys add` was told about the new key: its models, limits, quotas, team and admin right."""
    return {
        "models": args.key_models,
        "rpm": args.rpm,
        "tpm": args.tpm,
        "max_parallel": args.parallel,
        "tokens_per_day": args.tokens_per_day,
        "tokens_per_month": args.tokens_per_month,
        "team": args.team,
        "service_tiers": args.service_tiers,
        "max_batch_lines_in_flight": args.batch_lines,
        "admin": args.admin,
    }


def _set(store: api_keys.KeyStore, args: argparse.Namespace, settings: Settings) -> int:
    given = {
        "rpm": args.rpm,
        "tpm": args.tpm,
        "max_parallel": args.parallel,
        "tokens_per_day": args.tokens_per_day,
        "tokens_per_month": args.tokens_per_month,
        "team": args.team,
        "max_batch_lines_in_flight": args.batch_lines,
    }
    # Left out: unchanged; `none`: removed.
    changes: dict[str, Any] = {
        field: None if value == NONE else value for field, value in given.items() if value is not None
    }
    if args.service_tiers is not None:
        tiers = args.service_tiers.strip().lower()
        changes["service_tiers"] = [] if tiers == NONE else _names(tiers)
    if not changes:
        _say(
            "nothing to change: give --rpm, --tpm, --parallel, --tokens-per-day, --tokens-per-month, "
            "--batch-lines, --team or --service-tiers"
        )
        return 2
    _warn_unknown_team(changes.get("team"), settings)
    try:
        record = store.update(args.name, changes)
    except ValueError as exc:
        _say(str(exc))
        return 1
    except WatchError:
        _say(
            "another `switchboard keys` command changed the keys meanwhile; nothing was changed, run it again"
        )
        return 1
    if record is None:
        if any(k.name == args.name for k in settings.auth.keys):
            _say(f"key {args.name!r} is listed in the config file ([[auth.keys]]); change it there")
        else:
            _say(f"no key named {args.name!r} in Redis (key prefix {keys.PREFIX!r})")
        return 1
    _say(
        f"key {record.name!r} changed: {_limits(record)}. Front doors apply it within "
        f"{settings.auth.cache_s:g} s."
    )
    return 0


def _usage(
    client: redis.Redis, store: api_keys.KeyStore, args: argparse.Namespace, settings: Settings
) -> int:
    every_key = [*settings.auth.keys, *store.all()]
    counted = quotas.everyone_counted(every_key, settings.auth.teams)
    if args.name is not None:
        counted = [quotas.counted_key(k) for k in every_key if k.name == args.name]
        if args.name in {k.team for k in every_key} | set(settings.auth.teams):
            counted.append(quotas.counted_team(args.name, settings.auth.teams))
        if not counted:
            _say(f"no key or team named {args.name!r} (in the config or in Redis)")
            return 1
    periods = quotas.Periods.at(time.time())
    names = quotas.counter_keys(counted, periods)
    values: list[bytes | None] = client.mget(names) if names else []  # type: ignore[assignment]
    usage = quotas.usage_of(counted, periods, values)
    if args.json:
        print(msgspec.json.encode(quotas.UsageList(data=usage)).decode())
        return 0
    print(_render(USAGE_COLUMNS, [_usage_row(one) for one in usage]), end="")
    print(
        f"(UTC) the day {periods.day.partition(':')[2]} ends at {quotas.iso_time(periods.day_ends)}, "
        f"the month {periods.month.partition(':')[2]} at {quotas.iso_time(periods.month_ends)}; "
        "used counts what requests in flight reserved"
    )
    return 0


def _usage_row(usage: quotas.QuotaUsage) -> tuple[str, ...]:
    def used(period: quotas.PeriodUsage) -> str:
        return "not counted" if period.used is None else str(period.used)

    return (
        usage.name,
        usage.kind,
        usage.team or "-",
        used(usage.day),
        _limit(usage.day.limit),
        used(usage.month),
        _limit(usage.month.limit),
    )


def _remove(store: api_keys.KeyStore, name: str, settings: Settings) -> int:
    if store.remove(name):
        _say(
            f"key {name!r} removed; front doors stop accepting it within {settings.auth.cache_s:g} s. "
            "Its name is not given to a new key."
        )
        return 0
    if any(k.name == name for k in settings.auth.keys):
        _say(f"key {name!r} is listed in the config file ([[auth.keys]]); remove it there")
    else:
        _say(f"no key named {name!r} in Redis (key prefix {keys.PREFIX!r})")
    return 1


def _print_toml(args: argparse.Namespace, settings: Settings) -> int:
    _warn_unknown_models(args.key_models, settings)
    _warn_unknown_team(args.team, settings)
    try:
        # Redis is not asked (there may be none): the config's own names are checked.
        api_keys.check_name_free(args.name, taken={k.name for k in settings.auth.keys}, retired=set())
        secret, record = api_keys.make_key(args.name, **_limits_of(args))
    except ValueError as exc:
        _say(str(exc))
        return 1
    fields: dict[str, Any] = {
        "name": record.name,
        "sha256": record.sha256,
        "models": record.models or None,
        "rpm": record.rpm,
        "tpm": record.tpm,
        "max_parallel": record.max_parallel,
        "tokens_per_day": record.tokens_per_day,
        "tokens_per_month": record.tokens_per_month,
        "team": record.team,
        "service_tiers": record.service_tiers or None,
        "max_batch_lines_in_flight": record.max_batch_lines_in_flight,
        "admin": record.admin or None,
    }
    lines = [f"# The key itself (shown only now; give it to its user): {secret}", "[[auth.keys]]"]
    lines += [f"{name} = {json.dumps(value)}" for name, value in fields.items() if value is not None]
    print("\n".join(lines))
    return 0


def render_table(stored: list[ApiKey], configured: list[ApiKey]) -> str:
    """One line per key: its limits and where it is kept, never its secret or hash."""
    rows = [_row(k, "redis") for k in stored] + [_row(k, "config") for k in configured]
    return _render(COLUMNS, rows)


def _render(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A table of left-aligned columns, its header first."""
    table = [columns, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in table
    )


def _row(key: ApiKey, kept_in: str) -> tuple[str, ...]:
    created = "-"
    if key.created is not None:
        created = datetime.datetime.fromtimestamp(key.created).strftime("%Y-%m-%d %H:%M")
    return (
        key.name,
        ",".join(key.models) or "all",
        _limit(key.rpm),
        _limit(key.tpm),
        _limit(key.max_parallel),
        _limit(key.tokens_per_day),
        _limit(key.tokens_per_month),
        key.team or "-",
        "yes" if key.admin else "no",
        created,
        kept_in,
    )


def _limits(key: ApiKey) -> str:
    models = ", ".join(key.models) or "all"
    team = f"; team {key.team}" if key.team else ""
    admin = "; admin" if key.admin else ""
    return (
        f"models {models}; rpm {_limit(key.rpm)}, tpm {_limit(key.tpm)}, "
        f"parallel {_limit(key.max_parallel)}; tokens per day {_limit(key.tokens_per_day)}, "
        f"per month {_limit(key.tokens_per_month)}{team}{admin}"
    )


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _warn_unknown_models(models: list[str], settings: Settings) -> None:
    # A route or a pipeline is a name a key may be given, like a model (it then may use its steps).
    known = {m.name for m in settings.models} | set(settings.routes) | set(settings.pipelines)
    # A prefix (`acme/*`) names adapters registered at run time as well: no configuration lists them.
    unknown = sorted(name for name in set(models) - known if not name.endswith("*"))
    if unknown:
        _say(f"warning: models (or routes, pipelines) not in this configuration: {', '.join(unknown)}")


def _warn_unknown_team(team: str | None, settings: Settings) -> None:
    # A team's quotas are configured; a team the config lacks still counts its keys' tokens.
    if team and team != NONE and team not in settings.auth.teams:
        _say(
            f"warning: team {team!r} has no [auth.teams.{team}] table in this configuration: its keys' "
            "tokens are counted together, without a team quota"
        )


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _limit_or_none(text: str) -> int | str:
    return NONE if text.strip().lower() == NONE else _positive_int(text)


def _say(line: str) -> None:
    print(f"switchboard: {line}", file=sys.stderr, flush=True)
