"""The path benchmark's LiteLLM system (`bench/servers.py`) and its ratios (`bench/path_overhead.py`).

The proxy itself runs only in the benchmark: its packages are the `bench` group, which `make test`
does not install. These check what the benchmark gives it and what it makes of its figures.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from path_overhead import SYSTEMS, print_comparison, summarize_runs
from servers import LITELLM_PROXY_MODULES, MODEL_NAME, litellm_config

REPO = Path(__file__).resolve().parents[2]


def test_the_proxy_routes_the_demo_model_to_vllm_as_an_openai_backend() -> None:
    config = litellm_config("http://127.0.0.1:8123", "sk-bench-key")
    (entry,) = config["model_list"]
    assert entry["model_name"] == MODEL_NAME
    params = entry["litellm_params"]
    assert params["model"] == f"openai/{MODEL_NAME}"
    assert params["api_base"] == "http://127.0.0.1:8123/v1"
    assert config["general_settings"] == {"master_key": "sk-bench-key"}  # no database
    assert not any(config["litellm_settings"].values()), "no callbacks"
    assert config["router_settings"]["num_retries"] == 0


def test_the_config_written_as_json_reads_back_as_yaml() -> None:
    # spawn_litellm writes JSON into the proxy's YAML config file; YAML reads it as written.
    config = litellm_config("http://127.0.0.1:8123", "sk-bench-key")
    assert yaml.safe_load(json.dumps(config, indent=2)) == config


def test_the_proxy_modules_checked_are_the_bench_groups_packages() -> None:
    # The benchmark's early check (litellm_proxy_missing) looks for what the bench group adds.
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    bench = {re.split(r"[\[<>=]", requirement)[0].replace("-", "_") for requirement in optional["bench"]}
    assert set(LITELLM_PROXY_MODULES) <= bench


def level(concurrency: int, ttft_ms: float, tokens_per_s: float) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "ttft_p50_ms": ttft_ms,
        "ttft_p99_ms": ttft_ms * 2,
        "tokens_per_s": tokens_per_s,
        "errors": 0,
        "token_mismatches": 0,
    }


def test_switchboard_is_compared_with_litellm_in_front_of_vllm() -> None:
    figures = {"vllm": (10.0, 500.0), "vllm-si": (10.0, 550.0), "litellm": (20.0, 400.0)}
    figures["switchboard"] = (12.0, 520.0)
    assert set(figures) == set(SYSTEMS)
    runs = [{"system": system, "levels": [level(1, *figures[system])]} for system in SYSTEMS]
    (row,) = summarize_runs(runs, [1])
    assert row["ratio_litellm_ttft_p50_ms"] == 0.6  # 12 / 20
    assert row["ratio_litellm_ttft_p99_ms"] == 0.6
    assert row["ratio_litellm_tokens_per_s"] == 1.3  # 520 / 400
    assert row["ratio_vllm_ttft_p50_ms"] == 1.2
    assert row["litellm_ttft_p50_ms"] == 20.0 and row["litellm_errors"] == 0


def test_the_litellm_table_names_litellm(capsys: pytest.CaptureFixture[str]) -> None:
    runs = [{"system": system, "levels": [level(8, 10.0, 500.0)]} for system in SYSTEMS]
    print_comparison(summarize_runs(runs, [8]), "litellm")
    head, _, row = capsys.readouterr().out.splitlines()
    assert "TTFT p50 ms SB / LiteLLM / ratio" in head and "errors SB / LiteLLM" in head
    assert row.split("|")[1].strip() == "10.0 / 10.0 / 1.00"
