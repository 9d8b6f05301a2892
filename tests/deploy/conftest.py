"""Fixtures of the deployment tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.local.demo_model import build_demo_model
from tests.deploy.kubernetes_objects import SENTINEL_SWAP, Object, compose_kustomization


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model, built once per test session (what ./models/switchboard-demo holds)."""
    return build_demo_model(tmp_path_factory.mktemp("demo-model") / "model")


@pytest.fixture(scope="module")
def manifests() -> list[Object]:
    return compose_kustomization()


@pytest.fixture(scope="module")
def sentinel_manifests() -> list[Object]:
    return compose_kustomization(SENTINEL_SWAP)


@pytest.fixture(params=["plain", "sentinel"])
def either_manifests(
    request: pytest.FixtureRequest, manifests: list[Object], sentinel_manifests: list[Object]
) -> list[Object]:
    """The objects of either Redis: plain, or under Sentinel."""
    return sentinel_manifests if request.param == "sentinel" else manifests
