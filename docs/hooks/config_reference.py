"""The configuration reference page, written from the settings structs each time the site is built.

MkDocs runs this hook (mkdocs.yml `hooks:`); it adds `configuration.md` to the site's files
without writing it to disk. Every table of the tree under `switchboard.config.Settings` becomes a
section, every field a row: its name, type and bounds and default (from msgspec's own view of the
struct), and what it does (the comment block written above the field in the source, or a string
right after it, or a `msgspec.Meta(description=...)`). A field added to any struct of the tree
shows up on the next build: nothing here names a field.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

REPO = Path(__file__).resolve().parents[2]
PAGE = "configuration.md"

INTRO = """# Configuration reference

*This page is generated from the settings structs (`switchboard.config.Settings` and the structs it
holds) each time the site is built, so it lists exactly the fields the code reads.*

Configuration is one TOML file, given as `switchboard --config FILE`. Environment variables
override single fields of a top-level table as `SWITCHBOARD_<SECTION>__<FIELD>` (for example
`SWITCHBOARD_ROUTER__PORT=8001`; values are read as TOML literals where they parse as one), and
`REDIS_URL` / `REDIS_URL_FILE` set `redis.url` / `redis.url_file`. Everything is validated at
start: an unknown field or a value out of bounds stops the process with a message naming it.
"""


@dataclass(frozen=True)
class Table:
    """One table of the settings tree: where it sits in TOML, and the struct that reads it."""

    heading: str  # `[router]`, `[[models]]`, `[routes.NAME.shadow]`
    path: str  # router, models, routes.NAME.shadow: the prefix of its fields' names
    struct: type[msgspec.Struct]

    @property
    def anchor(self) -> str:
        return "cfg-" + "".join(c if c.isalnum() else "-" for c in self.path).strip("-")


def render() -> str:
    """The whole page, as Markdown."""
    from switchboard.config import Settings

    parts = [INTRO, _settings_table(Settings)]
    tables = list(_tables(Settings, heading="", path=""))
    anchors = {table.struct: table for table in tables}
    parts += [_section(table, anchors) for table in tables]
    return "\n".join(parts)


def _settings_table(settings: type[msgspec.Struct]) -> str:
    """The top of the tree: which tables a configuration file may hold."""
    rows = ["| table | what it holds |", "|---|---|"]
    for field in mi.type_info(settings).fields:  # type: ignore[union-attr]
        struct, shape = _struct_in(field.type)
        if struct is None:
            continue
        table = _child_table(Table("", "", settings), field.name, shape, struct)
        summary = _first_line(struct.__doc__)
        rows.append(f"| [`{table.heading}`](#{table.anchor}) | {_cell(summary)} |")
    return "\n".join(rows) + "\n"


def _tables(struct: type[msgspec.Struct], heading: str, path: str) -> Iterator[Table]:
    """Every table under `struct`, depth first, in the order the fields are declared."""
    here = Table(heading, path, struct)
    for field in mi.type_info(struct).fields:  # type: ignore[union-attr]
        child, shape = _struct_in(field.type)
        if child is None:
            continue
        table = _child_table(here, field.name, shape, child)
        yield table
        yield from _tables(table.struct, table.heading, table.path)


def _child_table(parent: Table, name: str, shape: str, struct: type[msgspec.Struct]) -> Table:
    """The table a field of `parent` holds: one table, an array of tables, or a table per name."""
    path = f"{parent.path}.{name}" if parent.path else name
    if shape == "list":
        return Table(f"[[{path}]]", path, struct)
    if shape == "dict":
        placeholder = "LABEL" if name == "targets" else "NAME"
        return Table(f"[{path}.{placeholder}]", f"{path}.{placeholder}", struct)
    return Table(f"[{path}]", path, struct)


def _struct_in(info: mi.Type) -> tuple[type[msgspec.Struct] | None, str]:
    """The struct a field's type holds, if any, and how: `one`, `list` or `dict` of them."""
    info = _unwrapped(info)
    if isinstance(info, mi.StructType):
        return info.cls, "one"
    if isinstance(info, mi.UnionType):
        for member in info.types:
            struct, shape = _struct_in(member)
            if struct is not None:
                return struct, shape
    if isinstance(info, mi.ListType) and isinstance(_unwrapped(info.item_type), mi.StructType):
        return _unwrapped(info.item_type).cls, "list"  # type: ignore[union-attr]
    if isinstance(info, mi.DictType) and isinstance(_unwrapped(info.value_type), mi.StructType):
        return _unwrapped(info.value_type).cls, "dict"  # type: ignore[union-attr]
    return None, ""


def _section(table: Table, anchors: dict[type[msgspec.Struct], Table]) -> str:
    """One table's heading, its struct's docstring and a row per field."""
    comments = _field_comments(table.struct)
    lines = [f"## `{table.heading}` {{#{table.anchor}}}", ""]
    if table.struct.__doc__:
        lines += [inspect.cleandoc(table.struct.__doc__), ""]
    lines += ["| setting | type | default | what it does |", "|---|---|---|---|"]
    for field in mi.type_info(table.struct).fields:  # type: ignore[union-attr]
        described = comments.get(field.name) or _meta_description(field.type)
        row = [
            f"`{table.path}.{field.name}`",
            _type_text(field.type, anchors),
            _default_text(field),
            described or "—",
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def _field_comments(struct: type) -> dict[str, str]:
    """Field name → the comment block right above it in the source, or a string right after it."""
    source = inspect.getsource(sys.modules[struct.__module__])
    lines = source.splitlines()
    tree = ast.parse(source)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == struct.__name__:
            body = node.body
            for index, statement in enumerate(body):
                if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                    continue
                text = _comment_above(lines, statement.lineno - 1) or _string_after(body, index)
                if text:
                    found[statement.target.id] = text
            break
    return found


def _comment_above(lines: list[str], line_index: int) -> str:
    """The `#` lines directly above line `line_index` (0-based), joined into one paragraph."""
    block: list[str] = []
    index = line_index - 1
    while index >= 0 and lines[index].strip().startswith("#"):
        block.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    return " ".join(block)


def _string_after(body: list[ast.stmt], index: int) -> str:
    """A field's docstring: a bare string literal on the statement after it."""
    after = body[index + 1] if index + 1 < len(body) else None
    if (
        isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    ):
        return " ".join(inspect.cleandoc(after.value.value).split())
    return ""


def _meta_description(info: mi.Type) -> str:
    if isinstance(info, mi.Metadata) and info.extra_json_schema:
        return str(info.extra_json_schema.get("description", ""))
    return ""


def _unwrapped(info: mi.Type) -> mi.Type:
    while isinstance(info, mi.Metadata):
        info = info.type
    return info


def _type_text(info: mi.Type, anchors: dict[type[msgspec.Struct], Table]) -> str:
    """A field's type in a reader's words: `number ≥ 0`, `list of string`, `"fork" or "spawn"`."""
    info = _unwrapped(info)
    if isinstance(info, mi.UnionType):
        members = [m for m in info.types if not isinstance(_unwrapped(m), mi.NoneType)]
        text = " or ".join(_type_text(m, anchors) for m in members)
        return text if len(members) == len(info.types) else f"{text} (optional)"
    if isinstance(info, mi.StructType):
        table = anchors.get(info.cls)
        return f"[table](#{table.anchor})" if table else "table"
    if isinstance(info, mi.ListType):
        return "list of " + _type_text(info.item_type, anchors)
    if isinstance(info, mi.DictType):
        return f"table of {_type_text(info.key_type, anchors)} → {_type_text(info.value_type, anchors)}"
    if isinstance(info, mi.LiteralType):
        return " or ".join(f"`{_toml(value)}`" for value in info.values)
    simple = {mi.IntType: "integer", mi.FloatType: "number", mi.StrType: "string", mi.BoolType: "boolean"}
    for kind, word in simple.items():
        if isinstance(info, kind):
            return word + _bounds(info)
    if isinstance(info, mi.AnyType):
        return "any"
    return type(info).__name__.removesuffix("Type").lower()


def _bounds(info: mi.Type) -> str:
    """The constraints msgspec checks on a value: `≥ 1`, `≤ 19`, at most 64 characters."""
    marks = []
    for attribute, mark in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        value = getattr(info, attribute, None)
        if value is not None:
            marks.append(f"{mark} {value}")
    if getattr(info, "max_length", None) is not None:
        marks.append(f"at most {info.max_length} characters")  # type: ignore[attr-defined]
    if getattr(info, "pattern", None) is not None:
        marks.append(f"matching `{info.pattern}`")  # type: ignore[attr-defined]
    return (" " + ", ".join(marks)) if marks else ""


def _default_text(field: mi.Field) -> str:
    if field.required:
        return "required"
    value: Any = field.default
    if value is msgspec.NODEFAULT:
        value = field.default_factory()
    if isinstance(value, msgspec.Struct):
        return "(its defaults)"
    if value is None:
        return "none"
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    """A value as it would be written in the TOML file (long strings cut short)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 40 and "\n" not in value else value.split("\n")[0][:37] + "…"
        return f'"{shown}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + "}"
    return str(value)


def _first_line(doc: str | None) -> str:
    return inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ") if doc else ""


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def on_files(files: Any, config: Any) -> Any:
    """MkDocs' hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
