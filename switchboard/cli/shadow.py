"""`switchboard shadow-answers ROUTE [--count N]`: the compared pairs a route with a shadow version and
`keep_answers` kept (`router.routing.rollouts.shadow`), read from Redis, oldest first, one JSON object a line.

Each pair names the request (`request_id`), the version that served it and its answer
(`served_model`, `served_text`, `served_ttft_s`, `served_finish_reason`), and the shadow's
(`shadow_model`, `shadow_text`, `shadow_ttft_s`, `shadow_finish_reason`); `id` is the entry's id in the
stream, whose first part is the unix time in milliseconds the pair was kept. The same entries are
`redis-cli XRANGE 'sb:shadow:{chat}:answers' - +`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from redis.exceptions import RedisError

from switchboard import keys
from switchboard.config import Settings
from switchboard.redis_address import describe
from switchboard.redis_conn import sync_client

DEFAULT_COUNT = 20
_SECONDS = ("served_ttft_s", "shadow_ttft_s")


def add_parser(commands: Any) -> None:
    """The `shadow-answers` command, on the CLI's subparsers."""
    parser = commands.add_parser(
        "shadow-answers",
        help="a route's kept pairs of answers, served and shadow (routes.NAME.shadow.keep_answers)",
    )
    parser.add_argument("route")
    parser.add_argument(
        "--count",
        type=int,
        default=DEFAULT_COUNT,
        help=f"the newest this many pairs (default {DEFAULT_COUNT})",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Print the newest `args.count` pairs of route `args.route`, oldest first; the exit code."""
    if not settings.redis.url:
        print("switchboard: no Redis is configured (set REDIS_URL or redis.url)", file=sys.stderr)
        return 2
    try:
        with sync_client(settings.redis.url, timeout_s=10) as client:
            entries = client.xrevrange(keys.shadow_answers(args.route), count=max(1, args.count))
    except RedisError as exc:
        print(f"switchboard: cannot reach Redis at {describe(settings.redis.url)}: {exc}", file=sys.stderr)
        return 1
    for entry_id, fields in reversed(entries):
        print(json.dumps(pair_of(entry_id, fields)))
    return 0


def pair_of(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, object]:
    """One kept pair as a JSON object: seconds as numbers, "" (none) as null."""
    pair: dict[str, object] = {"id": entry_id.decode()}
    for raw_name, raw_value in fields.items():
        name, value = raw_name.decode(), raw_value.decode()
        if name in _SECONDS or name.endswith("_finish_reason"):
            pair[name] = (float(value) if name in _SECONDS else value) if value else None
        else:
            pair[name] = value
    return pair
