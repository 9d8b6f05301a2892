"""Fixtures of the deployment tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.local.demo_model import build_demo_model


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model, built once per test session (what ./models/switchboard-demo holds)."""
    return build_demo_model(tmp_path_factory.mktemp("demo-model") / "model")
