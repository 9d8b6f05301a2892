"""The demo model's files, its real tokenizer and a prompt builder on it, shared by the engine test modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from switchboard.local.demo_model import build_demo_model
from workers.engines.prompts import PromptBuilder

# A short context, so a test can fill it with a few words.
SHORT_CONTEXT = 64


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model's files (weights, tokenizer, chat template), built once per test run."""
    return Path(build_demo_model(tmp_path_factory.mktemp("demo") / "model"))


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Any:
    """The demo model's tokenizer, loaded with transformers (the test is skipped without it)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(demo_model_dir)


@pytest.fixture(scope="module")
def builder(tokenizer: Any) -> PromptBuilder:
    """A prompt builder on the demo tokenizer with a short context (SHORT_CONTEXT tokens)."""
    return PromptBuilder(tokenizer, model_name="demo", max_model_len=SHORT_CONTEXT, vocab_size=len(tokenizer))
