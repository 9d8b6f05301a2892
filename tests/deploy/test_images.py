"""The Dockerfiles: multi-stage, non-root, pinned, installed from uv.lock as scripts/install.sh installs,
real commands; every image the deployment pulls pinned by digest (deploy/images.lock)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.deploy.compose_file import REPO, load_compose, raw_compose
from tests.support.deploy.dockerfiles import dockerfile_stages, exec_form, uv_installs
from tests.support.deploy.product import cli_command, settings_from

DOCKER = REPO / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
# What an image needs of the repository; everything else stays out of the build context.
SOURCES = {"pyproject.toml", "uv.lock", "README.md", "switchboard", "router", "workers"}
# uv's version and its files' hashes, which install.sh checks too.
UV_REQUIREMENTS = "scripts/uv-requirements.txt"
# The images that install from uv.lock; the TensorRT-LLM one holds NVIDIA's container's packages.
LOCKED = ("router", "worker-cpu", "worker-gpu")
WORKERS = ("worker-cpu", "worker-gpu", "worker-trtllm")
IMAGES_LOCK = REPO / "deploy" / "images.lock"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
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
        image, _, tag = stage.base.partition("@")[0].rpartition(":")
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
    assert copied <= SOURCES | {UV_REQUIREMENTS}
    # uv as install.sh installs it: by the version and hashes of one requirements file.
    assert UV_REQUIREMENTS in copied
    assert "--require-hashes -r /tmp/uv-requirements.txt" in " ".join(build.all("RUN"))
    assert f"--require-hashes --requirement {UV_REQUIREMENTS}" in _install_sh()
    if dockerfile.stem not in LOCKED:
        return
    # Exactly what uv.lock records (hashes checked, one index per package), as install.sh does.
    assert "uv.lock" in copied
    (install,) = [run for run in build.all("RUN") if "uv sync" in run]
    assert not [run for run in build.all("RUN") if "uv pip install" in run]
    words = shlex.split(install[install.index("uv sync") :])
    assert "--locked" in words and "--compile-bytecode" in words and "--no-editable" in words
    assert "uv sync --locked" in _install_sh() and "--compile-bytecode" in _install_sh()
    extras = {words[i + 1] for i, word in enumerate(words) if word == "--extra"}
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(optional), f"extras that pyproject.toml does not have: {extras - set(optional)}"
    assert "dev" not in extras and "--all-extras" not in words, "test tools stay out of images"
    expected = {"router": set(), "worker-cpu": {"cpu"}, "worker-gpu": {"gpu"}}[dockerfile.stem]
    assert extras == expected
    env = " ".join(build.all("ENV"))
    assert "UV_PROJECT_ENVIRONMENT=/opt/switchboard" in env  # the environment the final stage copies


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
    expected = SOURCES if dockerfile.stem in LOCKED else SOURCES - {"uv.lock"}
    assert allowed <= SOURCES and allowed >= expected


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
# NVIDIA's TensorRT-LLM release container, at the release workers/engines/trtllm/engine.py is written for.
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
    # The worker's own stream to Triton (workers/triton/grpc_stream.py) speaks HTTP/2 with h2.
    assert any(r.startswith("h2==") for r in requirements), "h2, which the gpu extra brings the others"
    assert all("==" in r for r in requirements if r != "."), "every package added is pinned"


def _images_lock() -> dict[str, str]:
    """deploy/images.lock: image (by tag) → the digest it is pinned to, or `-` where not looked up."""
    pins = {}
    for line in IMAGES_LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            image, digest = line.split()
            assert digest == "-" or DIGEST.fullmatch(digest), line
            pins[image] = digest
    return pins


def _pulled_images() -> dict[str, set[str]]:
    """Every image reference the deployment pulls (not the ones it builds), and where it is named."""
    found: dict[str, set[str]] = {}

    def add(reference: str, where: str) -> None:
        found.setdefault(reference, set()).add(where)

    for name, service in raw_compose()["services"].items():
        if "build" not in service:
            add(service["image"], f"compose.yaml: {name}")
    dockerfiles = [*DOCKERFILES, REPO / "deploy" / "gpu-check" / "Dockerfile"]
    for dockerfile in dockerfiles:
        syntax = re.match(r"# syntax=(\S+)", dockerfile.read_text())
        if syntax:
            add(syntax[1], dockerfile.name)
        _, stages = dockerfile_stages(dockerfile)
        for stage in stages:
            if not stage.base.startswith("switchboard/"):  # an image of ours, built first
                add(stage.base, dockerfile.name)
    for manifest in sorted((REPO / "deploy" / "k8s").glob("*.yaml")):
        for image in re.findall(r"^\s+image: (\S+)$", manifest.read_text(), re.MULTILINE):
            if not image.startswith("switchboard/"):  # ours: pinned at release, see kustomization.yaml
                add(image, manifest.name)
    return found


def test_every_image_the_deployment_pulls_is_in_the_images_lock() -> None:
    pins = _images_lock()
    pulled = _pulled_images()
    by_tag = {reference.partition("@")[0] for reference in pulled}
    assert by_tag == set(pins), (
        f"missing from deploy/images.lock: {by_tag - set(pins)}; unused: {set(pins) - by_tag}"
    )
    # Each is named as the lock pins it: `tag@digest`, or the bare tag while not looked up yet.
    for reference, where in pulled.items():
        tag, _, digest = reference.partition("@")
        expected = "" if pins[tag] == "-" else pins[tag]
        assert digest == expected, (
            f"{reference} ({', '.join(sorted(where))}): deploy/images.lock pins {pins[tag]}"
        )


_UNPINNED = sorted(image for image, digest in _images_lock().items() if digest == "-")


@pytest.mark.xfail(
    bool(_UNPINNED),
    reason=f"not looked up yet (no registry reachable where deploy/images.lock was written): "
    f"{', '.join(_UNPINNED)}; run scripts/pin-images.sh",
    strict=True,
)
def test_every_image_is_pinned_by_digest() -> None:
    unpinned = sorted(reference for reference in _pulled_images() if not DIGEST.search(reference))
    assert unpinned == []


def test_pin_images_writes_each_digest_into_every_reference(tmp_path: Path) -> None:
    """scripts/pin-images.sh against a registry that answers one digest per image (`crane digest`)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for path in ("compose.yaml", "deploy", "scripts"):
        source = REPO / path
        if source.is_dir():
            shutil.copytree(source, tree / path)
        else:
            shutil.copy(source, tree / path)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    crane = fake_bin / "crane"
    crane.write_text('#!/bin/sh\nprintf "sha256:%s\\n" "$(printf %s "$2" | sha256sum | cut -d" " -f1)"\n')
    crane.chmod(0o755)
    result = subprocess.run(
        [str(tree / "scripts" / "pin-images.sh")],
        env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    expected = {image: "sha256:" + hashlib.sha256(image.encode()).hexdigest() for image in _images_lock()}
    written = (tree / "deploy" / "images.lock").read_text()
    for image, digest in expected.items():
        assert re.search(rf"^{re.escape(image)}\s+{digest}$", written, re.MULTILINE)
    for image, digest in expected.items():
        for path in (
            tree / "compose.yaml",
            *(tree / "deploy").glob("**/*Dockerfile"),
            *(tree / "deploy" / "k8s").glob("*.yaml"),
        ):
            text = path.read_text()
            bare = re.findall(rf"(?<![\w./-]){re.escape(image)}(?![\w.@-])", text)
            assert not bare, f"{path.name} still names {image} by tag alone"
            if image in text:
                assert f"{image}@{digest}" in text


@pytest.mark.parametrize("dockerfile", [DOCKER / f"{name}.Dockerfile" for name in WORKERS], ids=str)
def test_worker_images_build_the_workers_triton_backend_into_the_package(dockerfile: Path) -> None:
    """Generators go through the worker's own Triton backend only where it is built: each worker image
    builds it (a C compiler in the build stage) before the package is installed, so that the wheel
    carries it; a library built on the machine that sends the context stays out of it."""
    _, stages = dockerfile_stages(dockerfile)
    runs = stages[0].all("RUN")
    (built,) = [i for i, run in enumerate(runs) if "workers.triton.native_backend" in run]
    (installed,) = [i for i, run in enumerate(runs) if "uv sync" in run or "uv pip install" in run]
    assert "gcc" in " ".join(runs[: built + 1]), "a C compiler in the build stage"
    assert built < installed or runs[built].index("native_backend") < runs[built].index("uv ")
    assert "**/*.so" in Path(f"{dockerfile}.dockerignore").read_text().split("\n")
    artifacts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"][
        "wheel"
    ]
    assert any(
        Path("workers/triton/native/libtriton_switchboard.so").match(glob) for glob in artifacts["artifacts"]
    )
