"""`switchboard models`: where every model stands, as a table, from the front door's `/admin/models`;
then the routes and pipelines (`/v1/models`). `switchboard models load | unload | prefetch NAME` asks
the workers' controllers to act on one model (`POST /admin/models/NAME/ACTION`).

Only the standard library: the CLI imports this without the front door's dependencies.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from switchboard.cli.pipelines import describe_steps

COLUMNS = ("MODEL", "STATE", "WHERE", "QUEUE", "IN-FLIGHT", "LAST LOAD", "TYPICAL LOAD", "IDLE", "LEAVES IN")
TIMEOUT_S = 10.0


ACTIONS = ("load", "unload", "prefetch")


def show_models(base_url: str, api_key: str | None = None, action: tuple[str, str] | None = None) -> int:
    """Print the models table of the front door at `base_url`; the process's exit code.

    `api_key` (an admin key) is needed once the front door has API keys. `action` (ACTION, NAME):
    ask for it first, then print the table.
    """
    url = f"{base_url.rstrip('/')}/admin/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        if action is not None:
            verb, name = action
            request = urllib.request.Request(
                f"{url}/{urllib.parse.quote(name, safe='')}/{verb}",
                data=b"{}",
                headers={**headers, "Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=TIMEOUT_S):
                print(f"asked the workers to {verb} {name}")
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S
        ) as response:
            payload = json.load(response)
    except urllib.error.HTTPError as exc:
        hint = " Pass an admin key with --key (or SWITCHBOARD_ADMIN_KEY)." if exc.code in (401, 403) else ""
        print(f"switchboard: {url} answered {exc.code}: {_error_message(exc)}{hint}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(
            f"switchboard: cannot reach the front door at {base_url} ({reason}); start it with "
            "`switchboard up` (or `switchboard router`), or point `--url` at the one that runs.",
            file=sys.stderr,
        )
        return 1
    except ValueError as exc:
        print(
            f"switchboard: {url} did not answer with JSON ({exc}); is that a Switchboard front door?",
            file=sys.stderr,
        )
        return 1
    print(render_table(payload) + render_names(_cards(base_url, headers)), end="")
    return 0


def render_names(cards: list[dict[str, Any]]) -> str:
    """Under the table, from `/v1/models`: each route with its targets, each pipeline with its shape
    and steps."""
    lines = []
    for card in cards:
        if card.get("owned_by") == "switchboard-route":
            lines.append(f"route {card['id']}: {', '.join(card.get('targets', []))}")
        elif card.get("owned_by") == "switchboard-pipeline":
            shape = card.get("shape", "fallbacks")
            steps = card.get("steps") or card.get("fallbacks", [])
            lines.append(f"pipeline {card['id']}: {shape} {describe_steps(shape, steps)}")
    return "".join(f"{line}\n" for line in lines)


def _cards(base_url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The model cards of `/v1/models`; none if it cannot be read (the table was, which matters more)."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return list(json.load(response).get("data", []))
    except (urllib.error.URLError, OSError, ValueError):
        return []


def render_table(payload: dict[str, Any]) -> str:
    """The table for a `/admin/models` payload: one line per model, each base's adapters under it,
    then one line per failed load. A base's adapters with nothing to show (cold, nothing waiting, no
    failure) are one line: a catalogue of thousands of fine-tunes must not bury the rest."""
    models: list[dict[str, Any]] = payload.get("data", [])
    rows: list[tuple[str, ...]] = []
    adapters: dict[str, list[dict[str, Any]]] = {}
    for model in models:
        if model.get("base"):
            adapters.setdefault(model["base"], []).append(model)
    for model in models:
        if model.get("base") and model["base"] in {m["name"] for m in models}:
            continue  # listed under its base
        rows.append(_row(model))
        rows += _adapter_rows(adapters.get(model["name"], []))
    notes = [_failure_note(model) for model in models if model.get("failure")]
    return _align([COLUMNS, *rows]) + "".join(f"{note}\n" for note in notes)


def _adapter_rows(adapters: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The rows of one base's adapters: those with anything to show, then how many are idle and cold."""
    shown = [a for a in adapters if a["state"] != "cold" or a.get("waiting") or a.get("failure")]
    rows = [(f"└ {row[0]}", *row[1:]) for row in map(_row, shown)]
    resting = len(adapters) - len(shown)
    if resting:
        rows.append(
            (f"└ {resting} more adapter{'s' if resting != 1 else ''}", "cold", *["-"] * (len(COLUMNS) - 2))
        )
    return rows


def human_seconds(seconds: float | None) -> str:
    """`7.1 s`, `42 s`, `4 min`, `2.5 h`; `-` for nothing."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _row(model: dict[str, Any]) -> tuple[str, ...]:
    load_seconds: dict[str, dict[str, Any]] = model.get("load_seconds") or {}
    state = model["state"]
    if model.get("failure") and state == "cold":
        state = "failed"
    idle = "busy" if model.get("in_flight") else human_seconds(model.get("idle_s"))
    leaves = "never" if model.get("never_leaves") else human_seconds(model.get("leaves_in_s"))
    return (
        model["name"],
        state,
        _where(model),
        str(model.get("waiting", 0)),
        str(model.get("in_flight", 0)),
        _per_kind(load_seconds, "last"),
        _per_kind(load_seconds, "typical"),
        idle,
        leaves,
    )


def _where(model: dict[str, Any]) -> str:
    """`w1@gpu-a#0`, one per replica; a replica whose state differs from the model's says so, and a
    warm one with work says what it runs and what waits for it (`2 running, 5 waiting`)."""
    places = []
    for replica in model.get("replicas", []):
        place = f"{replica['worker_id']}@{replica['host']}"
        if replica.get("replica") is not None:
            place += f"#{replica['replica']}"
        if replica["state"] == "loading" and replica.get("download"):
            place += f" ({_download(replica['download'])})"
        elif replica["state"] == "loading":
            elapsed = replica.get("loading_elapsed_s") or 0.0
            expected = replica.get("loading_expected_s")
            of = "?" if expected is None else human_seconds(expected)
            place += f" (loading {human_seconds(elapsed)} of {of})"
        elif replica["state"] != model["state"]:
            place += f" ({replica['state']})"
        if replica["state"] == "warm":
            place += _work(replica, model)
        places.append(place)
    return ", ".join(places) or "-"


def _download(download: dict[str, Any]) -> str:
    """`fetching 120/500 MB at 31 MB/s, 12 s left`: a load fetching the model's files first."""
    done, total = download.get("bytes_done", 0) / 1e6, download.get("bytes_total", 0) / 1e6
    rate = download.get("rate_bps") or 0.0
    at = f" at {rate / 1e6:.0f} MB/s" if rate else ""
    left = f", {human_seconds(download['eta_s'])} left" if download.get("eta_s") is not None else ""
    return f"fetching {done:.0f}/{total:.0f} MB{at}{left}"


def _work(replica: dict[str, Any], model: dict[str, Any]) -> str:
    """` (2 running, 5 waiting)` for a replica with work; nothing for an idle one. A replica that
    does not report what waits for it (an older front door) shows the model's queue."""
    running = int(replica.get("in_flight") or 0)
    waiting = int(replica.get("waiting", model.get("waiting")) or 0)
    return f" ({running} running, {waiting} waiting)" if running or waiting else ""


def _per_kind(load_seconds: dict[str, dict[str, Any]], field: str) -> str:
    """One kind: its value; several: each with its kind."""
    if len(load_seconds) == 1:
        (cost,) = load_seconds.values()
        return human_seconds(cost[field])
    return " / ".join(f"{human_seconds(cost[field])} {kind}" for kind, cost in load_seconds.items()) or "-"


def _failure_note(model: dict[str, Any]) -> str:
    failure = model["failure"]
    reason = failure.get("detail") or failure["reason"]
    return (
        f"{model['name']}: load failed on {failure['worker_id']}: {reason} "
        f"(retry in {human_seconds(failure['retry_in_s'])})"
    )


def _align(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "".join(f"{line}\n" for line in lines)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(exc)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return exc.reason if isinstance(exc.reason, str) else str(exc)
