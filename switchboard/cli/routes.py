"""`switchboard routes list | show NAME | set NAME MODEL=WEIGHT ...`: model routes' live weights,
through the front door's `/admin/routes` endpoints.

Only the standard library: the CLI imports this without the front door's dependencies.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

TIMEOUT_S = 10.0
# The admin key sent when --key is not given (as `switchboard models` does).
ADMIN_KEY_ENV = "SWITCHBOARD_ADMIN_KEY"


def add_parser(commands: Any) -> None:
    """The `routes` command and its subcommands, on the CLI's subparsers."""
    parser = commands.add_parser("routes", help="model routes: their live weights, and new weights")
    _add_front_door_flags(parser, default=None)
    # Also accepted after the subcommand (`routes set chat a=50 b=50 --url ...`); SUPPRESS leaves
    # what was given before it alone.
    after = argparse.ArgumentParser(add_help=False)
    _add_front_door_flags(after, default=argparse.SUPPRESS)
    actions = parser.add_subparsers(dest="routes_command", required=True)
    actions.add_parser("list", parents=[after], help="every route with its targets' weights")
    show = actions.add_parser("show", parents=[after], help="one route's targets and weights")
    show.add_argument("name")
    change = actions.add_parser(
        "set",
        parents=[after],
        help="new weights for a route, every target once: `set chat chat-v1=50 chat-v2=50`",
    )
    change.add_argument("name")
    change.add_argument("weights", nargs="+", type=_weight, metavar="MODEL=PERCENT")


def _add_front_door_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--url", default=default, help="the front door (default http://127.0.0.1:<router.port>)"
    )
    parser.add_argument(
        "--key", default=default, help=f"an admin API key, needed once keys exist (default: ${ADMIN_KEY_ENV})"
    )


def run(args: argparse.Namespace, base_url: str, api_key: str | None) -> int:
    """Run `routes list|show|set` against the front door at `base_url`; the process's exit code."""
    base = f"{base_url.rstrip('/')}/admin/routes"
    if args.routes_command == "list":
        payload = _call("GET", base, api_key)
        if payload is None:
            return 1
        print(render_routes(payload["data"]), end="")
        return 0
    path = f"{base}/{urllib.parse.quote(args.name, safe='')}"
    if args.routes_command == "show":
        route = _call("GET", path, api_key)
    else:
        route = _call("PUT", f"{path}/weights", api_key, {"weights": dict(args.weights)})
    if route is None:
        return 1
    print(render_routes([route]), end="")
    return 0


def render_routes(routes: list[dict[str, Any]]) -> str:
    """One line per route: its name, targets with weights in their fixed order, version, last change."""
    rows = [("ROUTE", "WEIGHTS", "VERSION", "CHANGED")]
    for route in routes:
        weights = "  ".join(f"{target['model']}={target['weight']}" for target in route["targets"])
        changed = route.get("updated")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(changed)) if changed else "-"
        rows.append((route["name"], weights, str(route["version"]), when))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def _call(method: str, url: str, api_key: str | None, body: Any = None) -> Any:
    """The JSON the front door answers, or None once the trouble is printed."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        hint = " Pass an admin key with --key (or SWITCHBOARD_ADMIN_KEY)." if exc.code in (401, 403) else ""
        print(f"switchboard: {url} answered {exc.code}: {_error_message(exc)}{hint}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(
            f"switchboard: cannot reach the front door at {url} ({reason}); start it with "
            "`switchboard up` (or `switchboard router`), or point `--url` at the one that runs.",
            file=sys.stderr,
        )
    except ValueError as exc:
        print(f"switchboard: {url} did not answer with JSON ({exc})", file=sys.stderr)
    return None


def _weight(text: str) -> tuple[str, int]:
    model, sep, percent = text.rpartition("=")
    if not sep or not model:
        raise argparse.ArgumentTypeError(f"expected MODEL=PERCENT, not {text!r}")
    try:
        return model, int(percent)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"the weight of {model} must be a whole percent, not {percent!r}"
        ) from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(exc)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return exc.reason if isinstance(exc.reason, str) else str(exc)
