"""The GPU check's own decisions, checked on any machine: when it runs, what it says when it cannot,
and the models it configures. (The check itself is marked `gpu`; these tests are not.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard.config import load_settings
from switchboard.local.demo_model import FORMAT_VERSION, MARKER_NAME
from switchboard.local.toml_text import toml_text
from tests.support.gpu import ENGINE_ARGS_ENV, NEEDS, asked_for, trtllm_model, unavailable_reason, vllm_model

REPO = Path(__file__).resolve().parents[2]
# One module of the check, run by a pytest of its own: what `make test` and `make gpu-check` see.
A_CHECK = "tests/gpu/test_trtllm_signals.py"


@pytest.mark.parametrize(
    ("markexpr", "asked"),
    [
        ("", False),
        ("e2e", False),
        ("not e2e", False),
        ("gpu", True),
        ("gpu and not slow", True),
        ("not gpu", False),
    ],
)
def test_the_check_runs_only_when_selected_by_its_marker(markexpr: str, asked: bool) -> None:
    assert asked_for(markexpr) is asked


def _skips(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", A_CHECK, "-q", "-rs", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.timeout(600)
def test_a_default_run_skips_the_check_at_once_and_says_how_to_run_it() -> None:
    output = _skips()
    assert "2 skipped" in output and "make gpu-check" in output and NEEDS in output
    if unavailable_reason() is not None:
        asked = _skips("-m", "gpu")
        assert "2 skipped" in asked and f"{NEEDS}:" in asked, asked


def test_the_models_it_serves_are_valid_settings_and_take_the_arguments_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = tmp_path / "demo"  # a finished demo model, as far as its marker tells (nothing is built)
    demo.mkdir()
    (demo / MARKER_NAME).write_text(FORMAT_VERSION + "\n")
    monkeypatch.setenv(
        ENGINE_ARGS_ENV, json.dumps({"max_batch_size": 4, "kv_cache_config": {"max_tokens": 512}})
    )
    trt = trtllm_model(demo, "trt", keep_alive_s=-1, engine_args={"max_seq_len": 512})
    assert trt["engine"] == "trtllm" and trt["keep_alive_s"] == -1
    args = trt["engine_args"]
    assert args["dtype"] == "bfloat16", "the demo model's float32 weights served in 16 bits"
    assert (args["max_batch_size"], args["kv_cache_config"], args["max_seq_len"]) == (
        4,
        {"max_tokens": 512},
        512,
    )
    assert args["enable_chunked_prefill"] is True
    plain = trtllm_model(tmp_path / "a-real-model", "real")
    assert "dtype" not in plain["engine_args"], "a model of one's own keeps its own dtype"
    vllm = vllm_model(demo, "vllm")
    # Written and read back the way the stack hands them to its processes.
    config = tmp_path / "switchboard.toml"
    config.write_text(toml_text({"models": [trt, plain, vllm]}))
    loaded = load_settings(config, environ={})
    assert [m.engine_name for m in loaded.models] == ["trtllm", "trtllm", "vllm"]
    assert loaded.models[0].engine_args == args
