"""The docs say what the code does: the configuration reference names every settings field, and the
README's configuration example is one the product loads.

The reference page is written from the settings structs when the site is built
(docs/hooks/config_reference.py); `make docs` proves it builds, these prove it is complete.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import msgspec
import msgspec.inspect

from switchboard.config import Settings, load_settings

REPO = Path(__file__).resolve().parents[1]


def _config_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "docs/hooks/config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _structs_under(struct: type[msgspec.Struct]) -> set[type[msgspec.Struct]]:
    """Every struct the settings tree can hold: each `StructType` msgspec finds anywhere inside it."""
    found: set[type[msgspec.Struct]] = set()

    def visit(info: object) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls in found:
                return
            found.add(info.cls)
            for field in info.fields:
                visit(field.type)
        for attribute in ("type", "item_type", "value_type"):
            if hasattr(info, attribute) and not isinstance(info, msgspec.inspect.StructType):
                visit(getattr(info, attribute))
        for member in getattr(info, "types", ()):
            visit(member)

    visit(msgspec.inspect.type_info(struct))
    return found


def test_the_configuration_reference_names_every_field_of_every_settings_struct() -> None:
    page = _config_reference().render()
    rows = set(re.findall(r"^\| `([\w.]+)` \|", page, flags=re.MULTILINE))
    named = {row.rsplit(".", 1)[-1] for row in rows}
    for struct in _structs_under(Settings):
        for field in msgspec.structs.fields(struct):
            if struct is Settings:
                continue  # the top-level tables are sections, not rows
            assert field.name in named, (
                f"{struct.__name__}.{field.name} is not on the configuration reference"
            )
    assert "`router.port`" in page and "`worker.max_concurrent_jobs`" in page


def test_a_field_comment_is_its_description_on_the_reference() -> None:
    page = _config_reference().render()
    (row,) = [line for line in page.splitlines() if line.startswith("| `limits.max_queue_depth` |")]
    assert "Jobs waiting on one model's stream that no worker has taken yet." in row
    assert "| integer ≥ 1 | `1024` |" in row


def test_the_readmes_configuration_example_is_one_the_product_loads(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    (example,) = re.findall(r"```toml\n(.*?)```", readme, flags=re.DOTALL)
    config = tmp_path / "switchboard.toml"
    config.write_text(example)
    settings = load_settings(config, environ={})
    assert [model.name for model in settings.models] == ["llama-3.1-8b", "qwen-2.5-7b", "bge-small"]
    assert "chat" in settings.routes
