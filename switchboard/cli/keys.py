"""`switchboard keys add | list | remove`: API keys kept in Redis, or printed for the config file.

A new key's secret is printed once, alone on stdout (so `KEY=$(switchboard keys add NAME)` works);
only its SHA-256 is kept. Everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

from redis.exceptions import RedisError, WatchError

from switchboard import api_keys, keys
from switchboard.config import ApiKey, Settings
from switchboard.redis_address import describe
from switchboard.redis_conn import sync_client

NO_REDIS = (
    "keys are kept in Redis, and no Redis is configured (set REDIS_URL or redis.url). "
    "`switchboard up` without REDIS_URL runs a private Redis that keeps nothing: list keys in the "
    "config instead, as `switchboard keys add NAME --toml` prints them."
)
COLUMNS = ("NAME", "MODELS", "RPM", "TPM", "PARALLEL", "ADMIN", "CREATED", "KEPT IN")


def add_parser(commands: Any) -> None:
    """The `keys` command and its subcommands, on the CLI's subparsers."""
    parser = commands.add_parser("keys", help="API keys: add (prints the key once), list, remove")
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
    add.add_argument("--rpm", type=_positive_int, help="requests per minute (default: no limit)")
    add.add_argument(
        "--tpm", type=_positive_int, help="tokens per minute, prompt and completion (default: no limit)"
    )
    add.add_argument("--parallel", type=_positive_int, help="requests in flight at once (default: no limit)")
    add.add_argument("--admin", action="store_true", help="may also call the /admin endpoints")
    add.add_argument(
        "--toml",
        action="store_true",
        help="print an [[auth.keys]] entry for the config instead of storing it",
    )
    actions.add_parser("list", help="the keys in Redis and in the config (never their secrets)")
    remove = actions.add_parser(
        "remove", help="remove a key from Redis (front doors notice within auth.cache_s)"
    )
    remove.add_argument("name")


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
            print(render_table(store.all(), settings.auth.keys), end="")
            return 0
    except RedisError as exc:
        _say(f"cannot reach Redis at {describe(settings.redis.url)}: {exc}")
        return 1


def _add(store: api_keys.KeyStore, args: argparse.Namespace, settings: Settings) -> int:
    _warn_unknown_models(args.key_models, settings)
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
    """What `keys add` was told about the new key: its models, limits and admin right."""
    return {
        "models": args.key_models,
        "rpm": args.rpm,
        "tpm": args.tpm,
        "max_parallel": args.parallel,
        "admin": args.admin,
    }


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
        "admin": record.admin or None,
    }
    lines = [f"# The key itself (shown only now; give it to its user): {secret}", "[[auth.keys]]"]
    lines += [f"{name} = {json.dumps(value)}" for name, value in fields.items() if value is not None]
    print("\n".join(lines))
    return 0


def render_table(stored: list[ApiKey], configured: list[ApiKey]) -> str:
    """One line per key: its limits and where it is kept, never its secret or hash."""
    rows = [_row(k, "redis") for k in stored] + [_row(k, "config") for k in configured]
    table = [COLUMNS, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
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
        "yes" if key.admin else "no",
        created,
        kept_in,
    )


def _limits(key: ApiKey) -> str:
    models = ", ".join(key.models) or "all"
    admin = "; admin" if key.admin else ""
    return (
        f"models {models}; rpm {_limit(key.rpm)}, tpm {_limit(key.tpm)}, "
        f"parallel {_limit(key.max_parallel)}{admin}"
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


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _say(line: str) -> None:
    print(f"switchboard: {line}", file=sys.stderr, flush=True)
