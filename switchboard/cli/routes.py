"""`switchboard routes list | show NAME | set NAME MODEL=WEIGHT ... | rollout NAME --canary MODEL ... |
abort NAME`: model routes' live weights and their progressive rollouts, through the front door's
`/admin/routes` endpoints.

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
    add_front_door_flags(parser, default=None)
    # Also accepted after the subcommand (`routes set chat a=50 b=50 --url ...`); SUPPRESS leaves
    # what was given before it alone.
    after = argparse.ArgumentParser(add_help=False)
    add_front_door_flags(after, default=argparse.SUPPRESS)
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
    _add_rollout_parser(actions, after)
    stop = actions.add_parser(
        "abort", parents=[after], help="abort a route's rollout: its canary back to 0 % at once"
    )
    stop.add_argument("name")


def _add_rollout_parser(actions: Any, after: argparse.ArgumentParser) -> None:
    rollout = actions.add_parser(
        "rollout",
        parents=[after],
        help="roll a canary out on a route step by step, judged against the stable target: "
        "`rollout chat --canary chat-v2`",
    )
    rollout.add_argument("name")
    rollout.add_argument("--canary", required=True, help="the target that takes the traffic step by step")
    rollout.add_argument("--steps", type=_steps, help="the canary's weight at each step (default 10,50,100)")
    rollout.add_argument(
        "--interval",
        type=_seconds,
        dest="interval_s",
        help="the least time a step lasts: 60s, 2m (default 60s)",
    )
    rollout.add_argument(
        "--min-requests", type=int, dest="min_requests", help="canary requests a check needs (default 20)"
    )
    rollout.add_argument(
        "--min-callers",
        type=int,
        dest="min_callers",
        help="distinct callers (keys; sessions with keys off) those requests come from (default 20)",
    )
    rollout.add_argument(
        "--max-failure-excess",
        type=_points,
        dest="max_failure_excess",
        help="percentage points the canary's failure rate may exceed stable's (default 5)",
    )
    rollout.add_argument(
        "--max-ttft-ratio", type=float, dest="max_ttft_p95_ratio", help="TTFT p95 vs stable's (default 1.5)"
    )
    rollout.add_argument(
        "--max-itl-ratio", type=float, dest="max_itl_p95_ratio", help="ITL p95 vs stable's (default 1.5)"
    )
    rollout.add_argument(
        "--failed-checks",
        type=int,
        dest="failed_checks_to_roll_back",
        help="failed checks that roll the canary back (default 2)",
    )
    rollout.add_argument(
        "--warm-timeout",
        type=_seconds,
        dest="warm_timeout_s",
        help="how long the canary may take to warm (default 10m)",
    )


# The `rollout` options that are plan settings (sent only when given: the front door has the defaults).
PLAN_OPTIONS = (
    "canary",
    "steps",
    "interval_s",
    "min_requests",
    "min_callers",
    "max_failure_excess",
    "max_ttft_p95_ratio",
    "max_itl_p95_ratio",
    "failed_checks_to_roll_back",
    "warm_timeout_s",
)


def add_front_door_flags(parser: argparse.ArgumentParser, default: Any) -> None:
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
        payload = admin_call("GET", base, api_key)
        if payload is None:
            return 1
        print(render_routes(payload["data"]), end="")
        return 0
    path = f"{base}/{urllib.parse.quote(args.name, safe='')}"
    if args.routes_command == "show":
        route = admin_call("GET", path, api_key)
    elif args.routes_command == "rollout":
        plan = {option: getattr(args, option) for option in PLAN_OPTIONS if getattr(args, option) is not None}
        route = admin_call("POST", f"{path}/rollout", api_key, plan)
    elif args.routes_command == "abort":
        route = admin_call("DELETE", f"{path}/rollout", api_key)
    else:
        route = admin_call("PUT", f"{path}/weights", api_key, {"weights": dict(args.weights)})
    if route is None:
        return 1
    print(render_routes([route]), end="")
    if route.get("rollout"):
        print(render_rollout(route["rollout"]), end="")
    return 0


def render_routes(routes: list[dict[str, Any]]) -> str:
    """One line per route: its name, targets with weights in their fixed order, version, last change,
    and its last rollout's canary and phase."""
    rows = [("ROUTE", "WEIGHTS", "VERSION", "CHANGED", "ROLLOUT")]
    for route in routes:
        weights = "  ".join(f"{target['model']}={target['weight']}" for target in route["targets"])
        changed = route.get("updated")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(changed)) if changed else "-"
        rollout = route.get("rollout")
        state = f"{rollout['canary']} {rollout['phase']}" if rollout else "-"
        rows.append((route["name"], weights, str(route["version"]), when, state))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def render_rollout(rollout: dict[str, Any]) -> str:
    """A route's rollout in a few lines: where it stands, its last check, how it ended."""
    steps = rollout["plan"]["steps"]
    where = f"step {rollout['step']}/{len(steps)}" if rollout["step"] else "no step yet"
    lines = [
        f"rollout {rollout['id']}: {rollout['canary']} against {rollout['stable']}: {rollout['phase']}, "
        f"{where}, canary at {rollout['canary_weight']} %, "
        f"{rollout['checks_failed']} failed check(s) of {rollout['plan']['failed_checks_to_roll_back']}"
    ]
    check = rollout.get("last_check")
    if check:
        verdict = "passed" if check["passed"] else "failed: " + "; ".join(check["reasons"])
        lines.append(f"  last check {_clock(check['at'])}: {verdict}")
        lines.append(f"    canary  {_figures(check['canary'])}")
        lines.append(f"    stable  {_figures(check['stable'])}")
    if rollout.get("reason"):
        lines.append(
            f"  {rollout['phase'].replace('_', ' ')} at {_clock(rollout['ended'])}: {rollout['reason']}"
        )
    return "".join(line + "\n" for line in lines)


def _figures(figures: dict[str, Any]) -> str:
    ttft, itl = figures.get("ttft_p95_s"), figures.get("itl_p95_s")
    return (
        f"{figures['requests']} requests, {figures['failure_rate'] * 100:.1f} % failed, "
        f"{figures.get('cold', 0)} cold, TTFT p95 {_ms(ttft)}, ITL p95 {_ms(itl)}"
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _clock(at: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "-"


def _steps(text: str) -> list[int]:
    try:
        return [int(step) for step in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole percents such as 10,50,100, not {text!r}") from None


def _seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit):
            number, scale = text[: -len(unit)], units[unit]
            break
    else:
        number, scale = text, 1.0
    try:
        return float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration such as 60s, 2m or 90, not {text!r}") from None


def _points(text: str) -> float:
    try:
        return float(text) / 100
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected percentage points such as 5, not {text!r}") from None


def admin_call(method: str, url: str, api_key: str | None, body: Any = None) -> Any:
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
