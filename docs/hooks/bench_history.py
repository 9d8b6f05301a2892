"""The benchmarks' dated result files (bench/results/YYYY-MM-DD-<bench>.md) as pages of the site.

MkDocs runs this hook (mkdocs.yml `hooks:`); each file becomes `benchmarks/history/<its name>`,
read from bench/results/ at every build, so a new dated file is on the site without being copied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def on_files(files: Any, config: Any) -> Any:
    """MkDocs' hook: add one page per dated result file."""
    from mkdocs.structure.files import File

    for result in sorted(RESULTS.glob("[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]-*.md")):
        files.append(File.generated(config, f"benchmarks/history/{result.name}", content=result.read_text()))
    return files
