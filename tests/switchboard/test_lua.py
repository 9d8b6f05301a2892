"""Every Redis script is a file of switchboard/lua/ that says its KEYS and ARGV at its top."""

from __future__ import annotations

from importlib import resources

import pytest

from switchboard import lua

SCRIPTS = sorted(
    entry.name.removesuffix(".lua")
    for entry in resources.files("switchboard.lua").iterdir()
    if entry.name.endswith(".lua")
)


def test_the_folder_holds_scripts() -> None:
    assert {"cancel", "jobs_waiting"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_documents_its_keys_at_its_top(name: str) -> None:
    text = lua.source(name)
    header = [line for line in text.splitlines() if line.startswith("--")]
    assert text.startswith("--"), name
    assert any("KEYS" in line for line in header), name
