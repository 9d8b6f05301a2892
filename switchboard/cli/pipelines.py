"""`switchboard pipelines list | show NAME | set NAME --file FILE | delete NAME`: model pipelines
(`switchboard.config.pipelines`) through the front door's `/admin/pipelines` endpoints.

`set` reads the pipeline's fields from a file, as TOML or JSON: the fields of its table
(`fallbacks = [...]`, or a `[router]` or `[cascade]` table), or a config's `[pipelines.NAME]` table
itself; `show` prints the definition in effect as JSON that `set` takes back.

Only the standard library: the CLI imports this without the front door's dependencies.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

from switchboard.cli.routes import add_front_door_flags, admin_call


def add_parser(commands: Any) -> None:
    """The `pipelines` command and its subcommands, on the CLI's subparsers."""
    parser = commands.add_parser(
        "pipelines", help="model pipelines: list, show, set or delete them on the running front doors"
    )
    add_front_door_flags(parser, default=None)
    # Also accepted after the subcommand; SUPPRESS leaves what was given before it alone.
    after = argparse.ArgumentParser(add_help=False)
    add_front_door_flags(after, default=argparse.SUPPRESS)
    actions = parser.add_subparsers(dest="pipelines_command", required=True)
    actions.add_parser("list", parents=[after], help="every pipeline with its shape and steps")
    show = actions.add_parser("show", parents=[after], help="one pipeline, and its definition as JSON")
    show.add_argument("name")
    change = actions.add_parser(
        "set",
        parents=[after],
        help="set a pipeline (a configured one's new definition, or a new one) from a TOML or JSON file",
    )
    change.add_argument("name")
    change.add_argument(
        "--file",
        required=True,
        type=Path,
        help="the pipeline's fields, TOML or JSON (`-`: read them from standard input)",
    )
    remove = actions.add_parser(
        "delete",
        parents=[after],
        help="take back what was set: a configured pipeline returns to the config's definition",
    )
    remove.add_argument("name")


def run(args: argparse.Namespace, base_url: str, api_key: str | None) -> int:
    """Run `pipelines list|show|set|delete` against the front door at `base_url`; the exit code."""
    base = f"{base_url.rstrip('/')}/admin/pipelines"
    if args.pipelines_command == "list":
        payload = admin_call("GET", base, api_key)
        if payload is None:
            return 1
        print(render_pipelines(payload["data"]), end="")
        return 0
    path = f"{base}/{urllib.parse.quote(args.name, safe='')}"
    if args.pipelines_command == "set":
        try:
            fields = read_definition(args.file, args.name)
        except (OSError, ValueError) as exc:
            print(f"switchboard: cannot read the pipeline from {args.file}: {exc}", file=sys.stderr)
            return 2
        answer = admin_call("PUT", path, api_key, fields)
    elif args.pipelines_command == "delete":
        answer = admin_call("DELETE", path, api_key)
    else:
        answer = admin_call("GET", path, api_key)
    if answer is None:
        return 1
    if answer.get("deleted"):
        print(f"pipeline {args.name} deleted")
        return 0
    print(render_pipelines([answer]), end="")
    if args.pipelines_command == "show":
        print(json.dumps(answer["definition"], indent=2))
    return 0


def read_definition(path: Path, name: str) -> dict[str, Any]:
    """The pipeline's fields in the file at `path` (`-`: standard input): JSON if it parses as JSON,
    else TOML; a config's `pipelines.NAME` table is taken from around them."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    try:
        fields = json.loads(text)
    except ValueError:
        try:
            fields = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"neither JSON nor TOML ({exc})") from None
    if not isinstance(fields, dict):
        raise ValueError("expected a table of the pipeline's fields")
    wrapped = fields.get("pipelines")
    if isinstance(wrapped, dict) and set(fields) == {"pipelines"}:
        if name not in wrapped:
            raise ValueError(f"it has [pipelines.*] tables, but none named {name!r}")
        fields = wrapped[name]
    return dict(fields)


def render_pipelines(pipelines: list[dict[str, Any]]) -> str:
    """One line per pipeline: its name, shape, what it does, and whose definition is in effect."""
    rows = [("PIPELINE", "SHAPE", "STEPS", "SOURCE")]
    rows += [(p["name"], p["shape"], describe_steps(p["shape"], p["steps"]), p["source"]) for p in pipelines]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def describe_steps(shape: str, steps: list[str]) -> str:
    """A pipeline's steps as its shape uses them: `a -> b` (fallbacks), `r chooses: a | b` (the
    router model, then its targets), `d, else s` (a cascade's draft, then its strong model)."""
    if shape == "router" and steps:
        return f"{steps[0]} chooses: {' | '.join(steps[1:])}"
    if shape == "cascade" and len(steps) == 2:
        return f"{steps[0]}, else {steps[1]}"
    return " -> ".join(steps)
