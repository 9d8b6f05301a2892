"""The Dockerfiles: multi-stage, non-root, pinned, installed as scripts/install.sh installs, real commands."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.support.deploy.compose_file import REPO, load_compose
from tests.support.deploy.dockerfiles import dockerfile_stages, exec_form, uv_installs
from tests.support.deploy.product import cli_command, settings_from

DOCKER = REPO / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
# What an image needs of the repository; everything else stays out of the build context.
SOURCES = {"pyproject.toml", "README.md", "switchboard", "router", "workers"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|KEY_SHA256|CREDENTIAL", re.IGNORECASE)
NVIDIA_REGISTRY = "nvcr.io/nvidia/"
NVIDIA_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"


def _install_sh() -> str:
    return (REPO / "scripts" / "install.sh").read_text()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.stem)
def test_images_are_multi_stage_non_root_and_pinned(dockerfile: Path) -> None:
    _, stages = dockerfile_stages(dockerfile)
    assert len(stages) >= 2, "build in one stage, copy the environment into a clean one"
    final = stages[-1]
    assert final.name is None and stages[0].name is not None
    # Only the built environment crosses from the build stage: no compilers or caches with it.
    assert final.all("COPY") == [f"--from={stages[0].name} /opt/switchboard /opt/switchboard"]
    for stage in stages:
        image, _, tag = stage.base.rpartition(":")
        assert image and re.search(r"\d+\.\d+", tag), f"{stage.base}: pin the base image's version"
    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 1000 and gid.isdigit(), "run as a numeric non-root user"
    assert f"--uid {uid}" in " ".join(final.all("RUN"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.stem)
def test_images_install_the_way_install_sh_does(dockerfile: Path) -> None:
    _, stages = dockerfile_stages(dockerfile)
    build = stages[0]
    copied = {part for argument in build.all("COPY") for part in argument.split()[:-1]}
    assert copied <= SOURCES
    (install,) = [run for run in build.all("RUN") if "uv pip install" in run]
    assert "--compile-bytecode" in install and "--compile-bytecode" in _install_sh()
    pin = re.search(r"uv==(\S+)", " ".join(build.all("RUN")))
    assert pin, "pin uv's version"
    (project,) = [word for word in shlex.split(install) if word == "." or word.startswith(".[")]
    extras = set(project.removeprefix(".[").removesuffix("]").split(",")) - {"."}
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(optional), f"extras that pyproject.toml does not have: {extras - set(optional)}"
    assert "dev" not in extras, "test tools stay out of images"
    if "cpu" in extras:
        # torch's CPU build comes from PyTorch's CPU index, exactly as install.sh asks uv for it.
        index = re.search(r"\(--extra-index-url (\S+) --index-strategy (\S+)\)", _install_sh())
        assert index, "install.sh no longer names the CPU index this way: update the CPU image too"
        assert f"--extra-index-url {index[1]} --index-strategy {index[2]}" in install


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.stem)
def test_images_start_a_real_command_and_bake_in_no_secret(dockerfile: Path) -> None:
    _, stages = dockerfile_stages(dockerfile)
    final = stages[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    argv = exec_form(entrypoint)
    assert argv[:2] == ["tini", "--"]  # SIGTERM passed on, children reaped
    if final.base.startswith(NVIDIA_REGISTRY):
        # NVIDIA's containers set up their CUDA environment in their own entrypoint, which execs the command.
        assert argv[2:] == [NVIDIA_ENTRYPOINT]
    else:
        assert argv == ["tini", "--"]
    (cmd,) = final.all("CMD")
    command = cli_command(exec_form(cmd))
    assert command.command == ("router" if dockerfile.stem == "router" else "worker")
    names = [
        word.split("=")[0]
        for stage in stages
        for keyword in ("ENV", "ARG")
        for argument in stage.all(keyword)
        for word in argument.split()
        if "=" in word or keyword == "ARG"
    ]
    assert not [name for name in names if SECRET_NAME.search(name)]
    env = dict(
        word.split("=", 1) for argument in final.all("ENV") for word in argument.split() if "=" in word
    )
    switchboard_env = {name: value for name, value in env.items() if name.startswith("SWITCHBOARD_")}
    settings_from(switchboard_env, None)  # every setting an image sets is a real one


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.stem)
def test_only_the_sources_reach_the_build_context(dockerfile: Path) -> None:
    ignore = Path(f"{dockerfile}.dockerignore").read_text().split("\n")
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    assert allowed == SOURCES


def test_compose_builds_every_service_from_these_dockerfiles() -> None:
    compose = load_compose()
    built = {
        name: REPO / service["build"]["dockerfile"]
        for name, service in compose["services"].items()
        if "build" in service
    }
    assert set(built) == {"router", "worker", "worker-cpu", "worker-trtllm"}
    for name, dockerfile in built.items():
        assert dockerfile in DOCKERFILES
        assert compose["services"][name]["build"]["context"] == "."
        image = compose["services"][name]["image"].rsplit("/", 1)[-1].split(":")[0]
        assert image == dockerfile.stem


TRTLLM_DOCKERFILE = DOCKER / "worker-trtllm.Dockerfile"
# NVIDIA's TensorRT-LLM release container, at the release workers/engines/trtllm.py is written for.
TRTLLM_RELEASE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"


def test_the_trtllm_image_builds_on_nvidias_release_container_and_moves_none_of_its_packages() -> None:
    _, stages = dockerfile_stages(TRTLLM_DOCKERFILE)
    assert {stage.base for stage in stages} == {TRTLLM_RELEASE}, "both stages on the one pinned release"
    runs = stages[0].all("RUN")
    (snapshot,) = [index for index, run in enumerate(runs) if "pip list --format=freeze" in run]
    (install,) = [index for index, run in enumerate(runs) if "uv pip install" in run]
    assert snapshot < install, "the container's packages are listed before anything is added"
    written = re.search(r"--format=freeze.*?> (\S+)", runs[snapshot])
    held = re.search(r"--constraint (\S+)", runs[install])
    assert written and held and Path(written[1]).name == Path(held[1]).name
    # The environment sees TensorRT-LLM and torch where the container put them.
    assert re.search(r"uv venv --system-site-packages .* /opt/switchboard\b", runs[install])


def test_the_trtllm_image_carries_no_vllm_and_the_pytriton_of_the_other_workers() -> None:
    _, stages = dockerfile_stages(TRTLLM_DOCKERFILE)
    (install,) = [run for run in stages[0].all("RUN") if "uv pip install" in run]
    ((python, _, requirements),) = [(i.python, i.constraints, i.requirements) for i in uv_installs(install)]
    assert python == "/opt/switchboard/bin/python"
    assert "." in requirements, "the project itself, with no extra (the extras bring vLLM)"
    assert not [r for r in requirements if "vllm" in r.lower() or r.startswith(".[")]
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pytriton = {r for r in optional["gpu"] if r.startswith("nvidia-pytriton")}
    assert pytriton and pytriton <= set(requirements), "PyTriton at the version the vLLM workers run"
    assert all("==" in r for r in requirements if r != "."), "every package added is pinned"
