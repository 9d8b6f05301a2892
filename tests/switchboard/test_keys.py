"""Redis key layout: one prefix, no collisions between families."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from switchboard import keys
from switchboard.config import load_settings
from tests.support.key_census import every_key_pattern

PER_ID = [keys.job_stream, keys.result_stream, keys.cancel_mark, keys.worker_record, keys.inbox]


@pytest.mark.parametrize("ident", ["x", "job-1", "Qwen/Qwen3-0.6B", "a:b"])
def test_every_key_is_prefixed_and_covered_by_patterns(ident: str) -> None:
    patterns = every_key_pattern()
    assert patterns
    generated = [fn(ident) for fn in PER_ID] + [keys.workers_index()]
    for key in generated:
        assert isinstance(key, str)
        assert key.startswith(f"{keys.PREFIX}:")
        assert key.startswith("sb:")
        assert any(fnmatchcase(key, p) for p in patterns), key


def test_key_contains_its_id() -> None:
    for fn in PER_ID:
        assert "abc123" in fn("abc123")


def test_families_do_not_collide_for_the_same_id() -> None:
    generated = [fn("same") for fn in PER_ID] + [keys.workers_index()]
    assert len(set(generated)) == len(generated)


def test_different_ids_give_different_keys() -> None:
    for fn in PER_ID:
        assert fn("a") != fn("b")


def test_ttls_are_positive() -> None:
    for ttl in (
        keys.JOB_STREAM_TTL_S,
        keys.RESULT_TTL_S,
        keys.CANCEL_TTL_S,
        keys.WORKER_TTL_S,
        keys.INBOX_TTL_S,
        keys.DEAD_LETTER_TTL_S,
    ):
        assert isinstance(ttl, int)
        assert ttl > 0


def test_job_group_is_a_name() -> None:
    assert isinstance(keys.JOB_GROUP, str) and keys.JOB_GROUP


def test_the_prefix_is_set_once_for_every_family() -> None:
    try:
        keys.set_prefix("prod:sb")
        generated = [fn("x") for fn in [*PER_ID, keys.key_rate, keys.key_in_flight]]
        generated += [keys.workers_index(), keys.api_keys(), keys.in_flight(), keys.demand_stream()]
        generated += [keys.dead_letter_stream()]
        assert all(key.startswith("prod:sb:") for key in generated)
        assert every_key_pattern() == ["prod:sb:*"]
    finally:
        keys.set_prefix("sb")
    assert keys.job_stream("x") == "sb:model:{x}:jobs"


@pytest.mark.parametrize("prefix", ["", "a b", "sb:", ":sb", "a::b", "x*"])
def test_a_prefix_that_would_blur_key_families_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="invalid key prefix"):
        keys.set_prefix(prefix)
    assert keys.PREFIX == "sb"


def test_loading_settings_leaves_the_process_key_prefix_alone(tmp_path: Path) -> None:
    # Whoever starts a process applies its prefix (the CLI: tests/switchboard/cli/test_keys.py).
    config = tmp_path / "switchboard.toml"
    config.write_text('[redis]\nkey_prefix = "prod:sb"\n')
    settings = load_settings(config, environ={"SWITCHBOARD_REDIS__KEY_PREFIX": "tenant-b"})
    assert settings.redis.key_prefix == "tenant-b"
    assert keys.PREFIX == "sb" and keys.job_stream("x") == "sb:model:{x}:jobs"


def hash_tag(key: str) -> str:
    """The part of `key` that decides its Redis Cluster slot (the whole key without a tag)."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1 : end] if start >= 0 and end > start + 1 else key


@pytest.mark.parametrize("model", ["tiny", "Qwen/Qwen3-0.6B", "a:b"])
def test_every_key_of_a_model_shares_its_hash_tag(model: str) -> None:
    model_keys = [
        keys.job_stream(model),
        keys.replica_lease(model, 0),
        keys.replica_lease(model, 7),
        keys.load_failure(model),
        keys.desired_state(model),
        keys.measured_costs(model, "H100", "load"),
        keys.model_limits(model),
    ]
    assert {hash_tag(key) for key in model_keys} == {model}
    assert hash_tag(keys.job_stream("other")) != model


def test_every_key_of_a_job_shares_its_hash_tag() -> None:
    job_keys = [keys.result_stream("j1"), keys.cancel_mark("j1"), keys.job_record("j1")]
    assert {hash_tag(key) for key in job_keys} == {"j1"}


def test_the_deployment_wide_keys_have_no_tag() -> None:
    for key in (keys.demand_index(), keys.catalogue_version(), keys.demand_stream(), keys.workers_index()):
        assert "{" not in key and key.startswith("sb:")
    assert len({keys.demand_index(), keys.catalogue_version(), keys.demand_stream()}) == 3


def test_token_counters_are_per_key_or_team_and_period_without_a_tag() -> None:
    counters = [
        keys.key_tokens("ab12", "day:2025-01-31"),
        keys.key_tokens("ab12", "month:2025-01"),
        keys.key_tokens("cd34", "day:2025-01-31"),
        keys.team_tokens("ab12", "day:2025-01-31"),
    ]
    assert len(set(counters)) == len(counters)
    assert all(key.startswith("sb:") and "{" not in key for key in counters)
    # Beside the key's other limits, which no other family's glob takes.
    assert counters[0] == "sb:api-key:ab12:tokens:day:2025-01-31"
    assert not fnmatchcase(counters[0], keys.key_rate("*")) and not fnmatchcase(
        counters[0], keys.key_in_flight("*")
    )
