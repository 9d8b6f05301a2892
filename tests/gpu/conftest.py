"""The GPU check: asked for with `-m gpu` (`make gpu-check`), skipped otherwise, and skipped with the
reason where this machine lacks a GPU or TensorRT-LLM. Deciding costs nothing: no engine import,
no CUDA, and nvidia-smi only runs when the check was asked for.

Fixtures: `gpu` (the GPU's memory), `model_dir` (the model every engine serves: the folder
`SWITCHBOARD_GPU_MODEL` names, else the demo model built here), `start_stack` (like the
end-to-end tests', on this GPU, with each stack's worker metrics on a port of its own).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from switchboard.local.demo_model import build_demo_model
from tests.support.gpu import (
    GPU_MODEL_ENV,
    NOT_ASKED_FOR,
    Gpu,
    GpuStack,
    StartStack,
    asked_for,
    gpu_from_env,
    stack_on,
    unavailable_reason,
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the GPU check unless it was asked for and this machine can run it, saying why."""
    checks = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not checks:
        return
    reason = unavailable_reason() if asked_for(config.getoption("markexpr") or "") else NOT_ASKED_FOR
    if reason is not None:
        for item in checks:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def gpu() -> Gpu:
    """The GPU the check runs on."""
    return gpu_from_env()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model every engine of the check serves; nothing is downloaded."""
    given = os.environ.get(GPU_MODEL_ENV)
    if given:
        path = Path(given)
        assert (path / "config.json").is_file(), f"{GPU_MODEL_ENV}={given} is not a Hugging Face model folder"
        return path
    return build_demo_model(tmp_path_factory.mktemp("demo-model") / "model")


@pytest.fixture
def start_stack(tmp_path: Path, request: pytest.FixtureRequest, gpu: Gpu) -> StartStack:
    """`start_stack(config, *, workers=1, env=None, worker_env=())`: a stack of its own for one test."""
    started = 0

    def start(config: Mapping[str, Any], **options: Any) -> contextlib.AbstractContextManager[GpuStack]:
        nonlocal started
        started += 1
        return stack_on(gpu, config, root=tmp_path / f"stack-{started}", session=request.session, **options)

    return start
