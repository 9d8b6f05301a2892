"""Dockerfiles read the way the deployment tests check them: stages, instructions, install lines."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    """One FROM ... of a Dockerfile and the instructions under it."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [argument for word, argument in self.instructions if word == keyword]


def dockerfile_stages(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """The build arguments declared before the first FROM (with defaults), and the stages."""
    text = re.sub(r"\\\n", " ", path.read_text())  # continuation lines
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, argument = line.partition(" ")
        word, argument = word.upper(), " ".join(argument.split())
        if word == "FROM":
            image, _, name = argument.partition(" AS ")
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image)
            stages.append(Stage(base=base, name=name or None))
        elif stages:
            stages[-1].instructions.append((word, argument))
        elif word == "ARG":
            name, _, default = argument.partition("=")
            args[name] = default
    return args, stages


def exec_form(argument: str) -> list[str]:
    """A JSON-array instruction argument (`CMD ["a", "b"]`) as a list."""
    value = json.loads(argument)
    assert isinstance(value, list), f"not the exec form: {argument}"
    return [str(part) for part in value]


@dataclass
class UvInstall:
    """One `uv pip install` command: into which Python, held by which constraint files, installing what."""

    python: str | None
    constraints: list[str]
    requirements: list[str]


# Options of `uv pip install` that take a value.
_TAKING_VALUE = {"--python", "--constraint", "-c", "--extra-index-url", "--index-strategy", "--index-url"}


def uv_installs(run: str) -> list[UvInstall]:
    """Every `uv pip install` command of a RUN instruction (commands joined with `&&`)."""
    installs = []
    for command in run.split("&&"):
        if "uv pip install" not in command:
            continue
        words = shlex.split(command[command.index("uv pip install") :])[3:]
        python, constraints, requirements = None, [], []
        option = None
        for word in words:
            if option is not None:
                if option == "--python":
                    python = word
                elif option in ("--constraint", "-c"):
                    constraints.append(word)
                option = None
            elif word in _TAKING_VALUE:
                option = word
            elif not word.startswith("-"):
                requirements.append(word)
        installs.append(UvInstall(python, constraints, requirements))
    return installs
