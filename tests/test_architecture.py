"""ARCHITECTURE.md lists every module of router/, workers/ and switchboard/, and nothing that is gone.

The layout part of that file is a map a newcomer trusts: a module added without its line, or a line
left behind by a module moved or removed, makes the map lie. Each module is listed under a heading
naming its folder (### `router/queue/`) as a bullet starting with its file name (- `enqueue.py`: ...).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "workers", "switchboard")
FOLDER_HEADING = re.compile(r"^### `(?P<folder>[\w/]+)/`\s*$")
MODULE_BULLET = re.compile(r"^- `(?P<name>[\w.]+\.py)`")


def modules_on_disk() -> set[str]:
    """Every Python module of the three packages, as a path from the repository root."""
    found = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name != "__init__.py" and "__pycache__" not in path.parts:
                found.add(path.relative_to(REPO).as_posix())
    return found


def modules_listed(text: str) -> set[str]:
    """Every module ARCHITECTURE.md lists: each bullet's file name under the folder heading above it."""
    listed = set()
    folder = None
    for line in text.splitlines():
        heading = FOLDER_HEADING.match(line)
        if heading:
            folder = heading["folder"]
        elif line.startswith("#"):
            folder = None
        elif folder is not None and (bullet := MODULE_BULLET.match(line)):
            listed.add(f"{folder}/{bullet['name']}")
    return listed


def test_architecture_lists_every_module_and_only_those() -> None:
    listed = modules_listed((REPO / "ARCHITECTURE.md").read_text())
    on_disk = modules_on_disk()
    unlisted = "\n  ".join(sorted(on_disk - listed))
    gone = "\n  ".join(sorted(listed - on_disk))
    assert not unlisted, f"modules ARCHITECTURE.md does not list (add a line each):\n  {unlisted}"
    assert not gone, f"ARCHITECTURE.md lists modules that do not exist (remove them):\n  {gone}"


def test_the_check_reads_the_headings_and_bullets_it_relies_on() -> None:
    text = "### `router/queue/`\n\nThe queue.\n\n- `enqueue.py`: puts a job.\n\n## Elsewhere\n\n- `stray.py`: x\n"
    assert modules_listed(text) == {"router/queue/enqueue.py"}
