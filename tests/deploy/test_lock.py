"""uv.lock: every install (scripts/install.sh, so `make` and CI, and the images) installs exactly what
it records, each package from the one index it names; no install searches several indexes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy.compose_file import REPO

LOCK = REPO / "uv.lock"
INSTALL_SH = REPO / "scripts" / "install.sh"
PYPI = "https://pypi.org/simple"
# Where an install is described: a search across indexes in any of these lets an index that should
# not serve a package (PyPI, for a name that is PyTorch's) serve it anyway.
INSTALL_FILES = [
    REPO / "pyproject.toml",
    REPO / "Makefile",
    REPO / "compose.yaml",
    *sorted((REPO / "scripts").glob("*.sh")),
    *sorted((REPO / ".ci").iterdir()),
    *sorted(path for path in (REPO / "deploy").rglob("*") if path.is_file()),
]
CROSS_INDEX = re.compile(r"unsafe-best-match|unsafe-first-match|extra-index-url|--index-strategy")


def _uv() -> str:
    """The uv of the environment (pyproject's dev extra), or the one install.sh installed."""
    candidates = [Path(sys.executable).parent / "uv", Path.home() / ".local" / "bin" / "uv"]
    found = next((str(path) for path in candidates if path.is_file()), None) or shutil.which("uv")
    if found is None:
        pytest.skip("no uv here (`make install` installs it)")
    return found


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@cache
def _lock() -> dict[str, Any]:
    return tomllib.loads(LOCK.read_text())


def test_the_lock_is_in_step_with_pyproject() -> None:
    # --offline: a lock that satisfies pyproject.toml is checked without any index; one that does not
    # would need a new resolution, and fails.
    check = subprocess.run(
        [_uv(), "lock", "--check", "--offline"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr


def test_torch_cpu_comes_from_pytorch_cpu_index_alone_and_nothing_else_does() -> None:
    uv = _pyproject()["tool"]["uv"]
    (index,) = uv["index"]
    assert index["explicit"] is True, "only packages pinned to it may come from PyTorch's index"
    assert uv["sources"] == {"torch": [{"index": index["name"], "extra": "cpu"}]}
    assert "index-strategy" not in uv and "extra-index-url" not in uv
    registries = {package["name"]: package["source"].get("registry") for package in _lock()["package"]}
    torches = [package for package in _lock()["package"] if package["name"] == "torch"]
    by_source = {package["version"]: package["source"]["registry"] for package in torches}
    assert by_source == {"2.13.0+cpu": index["url"], "2.13.0": PYPI}, "CPU build from PyTorch's index"
    others = {name for name, registry in registries.items() if registry not in (PYPI, None)}
    assert others == {"torch"}, f"from another index than PyPI: {others - {'torch'}}"


def test_every_locked_file_has_a_hash() -> None:
    for package in _lock()["package"]:
        if "registry" not in package["source"]:
            continue  # the project itself
        files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
        assert files, package["name"]
        for file in files:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", file.get("hash", "")), (package["name"], file)


def test_no_install_searches_across_indexes() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in INSTALL_FILES
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if CROSS_INDEX.search(line)
    ]
    assert found == []


def test_install_sh_installs_the_lock_and_nothing_else() -> None:
    script = INSTALL_SH.read_text()
    commands = [line.strip() for line in script.splitlines() if re.match(r"\s*uv (pip|sync|export)", line)]
    # Where PyTorch's index is reachable: `uv sync`, from the lock, refusing a stale one.
    (sync,) = [command for command in commands if command.startswith("uv sync")]
    assert "--locked" in sync.split() and "--compile-bytecode" in sync.split()
    # Where a local folder holds the torch CPU wheel: the lock exported with its hashes, synced with
    # every hash required, then the project alone (no dependency of it resolved anew).
    (export,) = [command for command in commands if command.startswith("uv export")]
    assert "--locked" in export.split() and "--no-hashes" not in export
    (pip_sync,) = [command for command in commands if command.startswith("uv pip sync")]
    assert "--require-hashes" in pip_sync.split()
    (project,) = [command for command in commands if command.startswith("uv pip install")]
    assert "--no-deps" in project.split() and project.endswith("-e .")
    dev = _pyproject()["project"]["optional-dependencies"]["dev"]
    assert f"uv=={_uv_pin()[0]}" in dev


def test_install_sh_installs_uv_only_with_the_hashes_the_lock_records() -> None:
    """uv, which installs the rest, was installed by version alone: any file served under its name."""
    script = INSTALL_SH.read_text()
    installs = [
        line for line in script.splitlines() if "uv-requirements.txt" in line and "--require-hashes" in line
    ]
    assert installs, "install.sh installs uv from scripts/uv-requirements.txt with --require-hashes"
    assert not re.search(r"pip install[^\n]*uv==", script), "uv installed by version alone"
    version, hashes = _uv_pin()
    (locked,) = [package for package in _lock()["package"] if package["name"] == "uv"]
    assert locked["version"] == version
    # The Linux x86-64 wheel (and every other file the lock knows) is accepted by its hash alone.
    locked_files = [locked["sdist"], *locked["wheels"]]
    assert {entry["hash"].removeprefix("sha256:") for entry in locked_files} <= hashes


def _uv_pin() -> tuple[str, set[str]]:
    """The version of uv scripts/uv-requirements.txt pins, and the sha256 hashes it accepts."""
    text = (REPO / "scripts" / "uv-requirements.txt").read_text()
    pin = re.search(r"^uv==(\S+)", text, re.MULTILINE)
    assert pin is not None
    return pin[1], set(re.findall(r"--hash=sha256:([0-9a-f]{64})", text))


def test_the_exported_lock_pins_every_package_with_the_locked_hashes() -> None:
    """What install.sh syncs where the torch wheel is local: every line pinned, hashed as locked."""
    exported = subprocess.run(
        [_uv(), "export", "--locked", "--offline", "--no-emit-project", "--extra", "cpu", "--extra", "dev"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    requirements = re.findall(
        r"^([A-Za-z0-9._-]+)==(\S+) ;.*?((?:\s+--hash=sha256:[0-9a-f]{64})+)", exported, re.M
    )
    assert len(requirements) > 100
    locked = {
        (package["name"], package["version"]): {file["hash"] for file in package.get("wheels", [])}
        | ({package["sdist"]["hash"]} if "sdist" in package else set())
        for package in _lock()["package"]
    }
    for name, version, hashes in requirements:
        assert set(re.findall(r"sha256:[0-9a-f]{64}", hashes)) <= locked[(name, version)], name
    assert ("torch", "2.13.0+cpu") in {(name, version) for name, version, _ in requirements}
    assert not re.search(r"^-e|^\.|^--(extra-)?index-url", exported, re.M)


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=~!; ]", requirement)[0].lower().replace("_", "-")


def test_make_test_installs_none_of_the_bench_groups_own_packages() -> None:
    """`make bench` adds the `bench` group (LiteLLM's proxy, py-spy); `make test` and CI install the
    engine build and dev alone, so none of the packages the bench group adds enters their install."""
    optional = _pyproject()["project"]["optional-dependencies"]
    bench_only = {_requirement_name(r) for r in optional["bench"]} - {
        _requirement_name(r) for r in optional["dev"]
    }
    assert bench_only, "the bench group adds packages"
    exported = subprocess.run(
        [_uv(), "export", "--locked", "--offline", "--no-emit-project", "--extra", "cpu", "--extra", "dev"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    installed = {name.lower() for name in re.findall(r"^([A-Za-z0-9._-]+)==", exported, re.M)}
    assert not bench_only & installed
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test: install$", makefile, re.M) and re.search(
        r"^install:\n\t@scripts/install.sh$", makefile, re.M
    ), "make test installs with no extra group"
