"""The benchmarks are scripts that import their neighbours by name (`from scale_load import ...`), as
they do when run as `python bench/scale.py`: their folder goes on the import path for these tests."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
