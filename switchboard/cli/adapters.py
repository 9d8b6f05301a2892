"""`switchboard adapters list | add NAME --base BASE --path PATH | add --file FILE | rm NAME...`: LoRA
adapters registered at run time (`switchboard.adapter_registry`) through the front door's
`/admin/adapters` endpoints.

`add --file` registers a catalogue at once: one JSON object per line (`.jsonl`), or a TOML file of
`[[adapters]]` tables, each an adapter's `[[models]]` entry (`name`, `base`, `path`, and optionally
`storage`, `keep_alive_s`, `priority`, `weight`, `max_replicas`). It stops at the first entry the
front door refuses, saying which line it was, unless `--keep-going`; an adapter registered already
with the same base and path is passed over, so the same command run again after a fix goes on where
it stopped.

Only the standard library: the CLI imports this without the front door's dependencies.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from switchboard.cli.models import human_seconds
from switchboard.cli.routes import add_front_door_flags, admin_call

# `add --file` reports how far it got after every this many entries.
PROGRESS_EVERY = 100
# Files read as one JSON object per line whatever they hold; `.toml` is TOML, and any other file
# (standard input too) is JSON lines if it starts with `{`.
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")
# The failed entries a `--keep-going` run names at its end (each was reported as it failed).
FAILURES_NAMED = 10
# A TOML table of `[[adapters]]`: where it starts, for the line a refusal names.
_TOML_HEADER = re.compile(r"\s*\[\[\s*adapters\s*\]\]")

# What became of one entry of a file.
Outcome = Literal["registered", "already", "failed"]


def add_parser(commands: Any) -> None:
    """The `adapters` command and its subcommands, on the CLI's subparsers."""
    parser = commands.add_parser(
        "adapters",
        help="LoRA adapters registered at run time: list, add (one, or a catalogue from a file) or rm them",
    )
    add_front_door_flags(parser, default=None)
    # Also accepted after the subcommand; SUPPRESS leaves what was given before it alone.
    after = argparse.ArgumentParser(add_help=False)
    add_front_door_flags(after, default=argparse.SUPPRESS)
    actions = parser.add_subparsers(dest="adapters_command", required=True)
    actions.add_parser(
        "list", parents=[after], help="every adapter (the config's and the registered), by base then name"
    )
    add = actions.add_parser(
        "add",
        parents=[after],
        help="register one adapter (NAME --base BASE --path PATH), or many (--file)",
    )
    add.add_argument("name", nargs="?", metavar="NAME", help="the adapter's model name, as requests name it")
    add.add_argument("--base", help="the configured generator it adapts (its entry needs a lora table)")
    add.add_argument("--path", help="its files: a local folder, s3://bucket/prefix or hf://org/name")
    add.add_argument(
        "--keep-alive-s",
        type=float,
        dest="keep_alive_s",
        metavar="S",
        help="seconds it stays loaded with nothing to do (0: leaves at once, -1: never; default 300)",
    )
    add.add_argument(
        "--priority", type=int, metavar="N", help="its priority when slots are scarce (default 0)"
    )
    add.add_argument(
        "--endpoint-url", metavar="URL", help="the S3-compatible store of an s3:// path (its storage table)"
    )
    add.add_argument(
        "--region", metavar="R", help="the bucket's region, for an s3:// path (its storage table)"
    )
    add.add_argument(
        "--file",
        type=Path,
        metavar="FILE",
        help="register every adapter in this file: one JSON object per line (.jsonl), or TOML "
        "[[adapters]] tables (.toml), each an adapter's [[models]] fields; `-`: standard input. One "
        "registered already with the same base and path is passed over",
    )
    add.add_argument(
        "--keep-going",
        action="store_true",
        help="with --file: register the others past a refused entry, and count the failures",
    )
    remove = actions.add_parser(
        "rm", parents=[after], help="remove registered adapters (the config's stay: edit the config)"
    )
    remove.add_argument("names", nargs="+", metavar="NAME")


def run(args: argparse.Namespace, base_url: str, api_key: str | None) -> int:
    """Run `adapters list|add|rm` against the front door at `base_url`; the exit code."""
    base = f"{base_url.rstrip('/')}/admin/adapters"
    if args.adapters_command == "list":
        payload = admin_call("GET", base, api_key)
        if payload is None:
            return 1
        print(render_adapters(payload["data"]), end="")
        return 0
    if args.adapters_command == "rm":
        return _remove(base, api_key, args.names)
    if args.file is not None:
        return _add_many(base, api_key, args)
    return _add_one(base, api_key, args)


def _add_one(base: str, api_key: str | None, args: argparse.Namespace) -> int:
    missing = [
        flag
        for flag, value in (("NAME", args.name), ("--base", args.base), ("--path", args.path))
        if not value
    ]
    if missing:
        print(
            f"switchboard: `adapters add` needs {', '.join(missing)}: `switchboard adapters add NAME "
            "--base BASE --path PATH` registers one adapter, `--file FILE` a catalogue of them",
            file=sys.stderr,
        )
        return 2
    if args.keep_going:
        print("switchboard: --keep-going is for --file; leave it out to add one adapter", file=sys.stderr)
        return 2
    entry: dict[str, Any] = {"name": args.name, "base": args.base, "path": args.path}
    for field in ("keep_alive_s", "priority"):
        if getattr(args, field) is not None:
            entry[field] = getattr(args, field)
    storage = {field: getattr(args, field) for field in ("endpoint_url", "region") if getattr(args, field)}
    if storage:
        entry["storage"] = storage
    answer = admin_call("POST", base, api_key, entry)
    if answer is None:
        return 1
    print(render_adapters([answer]), end="")
    return 0


@dataclass(frozen=True)
class CatalogueEntry:
    """One adapter of a file: where it is (`FILE:LINE`), and its fields or why it could not be read."""

    where: str
    fields: dict[str, Any] | None = None
    problem: str | None = None


def _add_many(base: str, api_key: str | None, args: argparse.Namespace) -> int:
    given = [
        flag
        for flag, value in (
            ("NAME", args.name),
            ("--base", args.base),
            ("--path", args.path),
            ("--keep-alive-s", args.keep_alive_s),
            ("--priority", args.priority),
            ("--endpoint-url", args.endpoint_url),
            ("--region", args.region),
        )
        if value is not None
    ]
    if given:
        print(
            f"switchboard: `adapters add --file` takes every field from the file; leave out {', '.join(given)} "
            "(or leave out --file to add one adapter)",
            file=sys.stderr,
        )
        return 2
    try:
        entries = read_entries(args.file)
    except (OSError, ValueError) as exc:
        print(f"switchboard: cannot read adapters from {args.file}: {exc}", file=sys.stderr)
        return 2
    # What is registered already, and whether the front door answers this key, before the first entry.
    listed = admin_call("GET", base, api_key)
    if listed is None:
        return 1
    known = {adapter["id"]: (adapter["base"], adapter["path"]) for adapter in listed["data"]}
    counts: dict[Outcome, int] = {"registered": 0, "already": 0}
    failed: list[str] = []
    stopped = None
    for done, entry in enumerate(entries, 1):
        outcome = _register(base, api_key, entry, known)
        if outcome == "failed":
            failed.append(entry.where)
            if not args.keep_going:
                stopped = entry.where
                break
        else:
            counts[outcome] += 1
        if done % PROGRESS_EVERY == 0 and done < len(entries):
            print(
                f"  {done} of {len(entries)} entries: {counts['registered']} registered, "
                f"{counts['already']} registered already, {len(failed)} failed",
                file=sys.stderr,
                flush=True,
            )
    registered = counts["registered"]
    print(
        f"{registered} adapter(s) registered from {args.file}, {counts['already']} registered already, "
        f"{len(failed)} failed, of {len(entries)} entries"
    )
    if stopped is not None:
        print(
            f"switchboard: stopped at {stopped}; the adapters registered before it stay registered. Fix "
            "that entry and run the same command again (adapters registered already are passed over), or "
            "add --keep-going to register the rest and count the failures.",
            file=sys.stderr,
        )
        return 1
    if failed:
        named = ", ".join(failed[:FAILURES_NAMED]) + (" ..." if len(failed) > FAILURES_NAMED else "")
        print(
            f"switchboard: {len(failed)} entries failed ({named}); fix them and run the same command "
            "again (adapters registered already are passed over).",
            file=sys.stderr,
        )
        return 1
    return 0


def _register(
    base: str, api_key: str | None, entry: CatalogueEntry, known: dict[str, tuple[Any, Any]]
) -> Outcome:
    """Register one entry of a file: `registered`, `already` (the same name, base and path are
    registered), or `failed` once the trouble is printed. `known` learns what is registered."""
    if entry.fields is None:
        print(f"switchboard: {entry.where}: {entry.problem}", file=sys.stderr)
        return "failed"
    name = entry.fields.get("name")
    here = (entry.fields.get("base"), entry.fields.get("path"))
    if isinstance(name, str) and known.get(name) == here:
        return "already"
    if admin_call("POST", base, api_key, entry.fields) is None:  # it printed what the front door said
        print(f"switchboard: {entry.where}: adapter {name!r} was not registered", file=sys.stderr)
        return "failed"
    if isinstance(name, str):
        known[name] = here
    return "registered"


def read_entries(path: Path) -> list[CatalogueEntry]:
    """The adapters in the file at `path` (`-`: standard input): JSON lines (one object per line),
    or TOML `[[adapters]]` tables; each with where it is. ValueError when the file cannot be read
    as either; a JSON line that is no object is an entry with its problem."""
    label = "stdin" if str(path) == "-" else str(path)
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError("it holds no adapters")
    if path.suffix in JSON_LINES_SUFFIXES or (path.suffix != ".toml" and text.lstrip().startswith("{")):
        return _json_lines(text, label)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON lines nor TOML"
        raise ValueError(f"not {kind} ({exc})") from None
    tables = document.get("adapters")
    others = sorted(set(document) - {"adapters"})
    if not isinstance(tables, list) or not all(isinstance(table, dict) for table in tables) or others:
        found = f"; it has {', '.join(others)}" if others else ""
        raise ValueError(
            "expected [[adapters]] tables and nothing else, each an adapter's [[models]] fields "
            f"(name, base, path...){found}"
        )
    # Each table's line: the n-th `[[adapters]]` header, where every table has one.
    headers = [n for n, line in enumerate(text.splitlines(), 1) if _TOML_HEADER.match(line)]
    if len(headers) == len(tables):
        return [CatalogueEntry(f"{label}:{n}", dict(table)) for n, table in zip(headers, tables, strict=True)]
    return [CatalogueEntry(f"{label}, adapter {n}", dict(table)) for n, table in enumerate(tables, 1)]


def _json_lines(text: str, label: str) -> list[CatalogueEntry]:
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{label}:{n}"
        try:
            fields = json.loads(line)
        except ValueError as exc:
            entries.append(
                CatalogueEntry(where, problem=f"not JSON ({exc}); write one adapter's object per line")
            )
            continue
        if isinstance(fields, dict):
            entries.append(CatalogueEntry(where, fields))
        else:
            entries.append(
                CatalogueEntry(
                    where, problem="expected an object of the adapter's fields (name, base, path...)"
                )
            )
    return entries


def _remove(base: str, api_key: str | None, names: list[str]) -> int:
    failed = 0
    for name in names:
        # Adapter names may hold slashes (`acme/support-v3`): the endpoint takes the rest of the path.
        answer = admin_call("DELETE", f"{base}/{urllib.parse.quote(name, safe='/')}", api_key)
        if answer is None:
            failed += 1
        else:
            print(f"adapter {name} removed")
    if failed:
        print(
            f"switchboard: {failed} of {len(names)} adapter(s) not removed; `switchboard adapters list` shows "
            "the adapters, and which of them the config file has (those are removed from the file).",
            file=sys.stderr,
        )
        return 1
    return 0


def render_adapters(adapters: list[dict[str, Any]]) -> str:
    """One line per adapter, by base then name: its name, base, who registered it (the config, or
    the admin API), its files and its keep-alive."""
    rows = [("NAME", "BASE", "SOURCE", "PATH", "KEEP-ALIVE")]
    rows += [
        (a["id"], a["base"], a["source"], a["path"], _keep_alive(a["keep_alive_s"]))
        for a in sorted(adapters, key=lambda a: (a["base"], a["id"]))
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def _keep_alive(seconds: float) -> str:
    return "never leaves" if seconds < 0 else human_seconds(seconds)
