"""`switchboard keys add | set | list | usage | remove` against a real Redis, and `--toml` for the
config file."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from switchboard import api_keys, keys, quotas
from switchboard.cli import main as cli
from switchboard.config import ApiKey, load_settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.quotas import Periods

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(
    redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """`switchboard ARGS` with REDIS_URL set; returns (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    with sync_redis.Redis.from_url(redis_server.url) as client:
        client.flushdb()

        def invoke(*argv: str) -> tuple[int, str, str]:
            code = cli.main(list(argv))
            out, err = capsys.readouterr()
            return code, out, err

        yield invoke
        client.flushdb()


def test_add_prints_the_key_once_and_stores_only_its_hash(run: Run, redis_server: PrivateRedis) -> None:
    code, out, err = run("keys", "add", "alice", "--models", "a, b", "--rpm", "60", "--parallel", "2")
    assert code == 0
    secret = out.strip()
    assert secret.startswith(api_keys.SECRET_PREFIX) and len(secret) > 40
    assert "only time it is shown" in err
    with sync_redis.Redis.from_url(redis_server.url) as client:
        stored = client.hgetall(keys.api_keys())
    (record,) = api_keys.decode_stored(stored)
    assert record.sha256 == api_keys.digest(secret)
    assert (record.name, record.models, record.rpm, record.tpm, record.max_parallel) == (
        "alice",
        ["a", "b"],
        60,
        None,
        2,
    )
    assert secret.encode() not in b"".join([*stored, *stored.values()])


def test_a_command_puts_its_keys_under_the_configured_prefix(
    run: Run, redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_REDIS__KEY_PREFIX", "tenant-b")
    assert run("keys", "add", "alice")[0] == 0
    with sync_redis.Redis.from_url(redis_server.url) as client:
        assert client.hlen("tenant-b:api-keys") == 1
        assert not client.exists("sb:api-keys")


def test_names_are_unique(run: Run) -> None:
    assert run("keys", "add", "alice")[0] == 0
    code, out, err = run("keys", "add", "alice")
    assert code == 1 and out == ""
    assert "exists already" in err


def test_list_shows_limits_never_secrets_or_hashes(run: Run) -> None:
    secret = run("keys", "add", "alice", "--tpm", "1000", "--admin")[1].strip()
    code, out, _ = run("keys", "list")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == [
        "NAME",
        "MODELS",
        "RPM",
        "TPM",
        "PARALLEL",
        "TOKENS/DAY",
        "TOKENS/MONTH",
        "TEAM",
        "ADMIN",
        "CREATED",
        "KEPT",
        "IN",
    ]
    assert row.split()[:9] == ["alice", "all", "-", "1000", "-", "-", "-", "-", "yes"]
    assert secret not in out
    assert api_keys.digest(secret)[:16] not in out


def test_remove_takes_the_key_out_of_redis(run: Run, redis_server: PrivateRedis) -> None:
    run("keys", "add", "alice")
    run("keys", "add", "bob")
    assert run("keys", "remove", "alice")[0] == 0
    code, _, err = run("keys", "remove", "alice")
    assert code == 1 and "no key named 'alice'" in err
    assert [line.split()[0] for line in run("keys", "list")[1].splitlines()[1:]] == ["bob"]


def test_toml_prints_a_config_entry_that_the_front_door_accepts(run: Run, tmp_path: Path) -> None:
    code, out, _ = run("keys", "add", "ci", "--toml", "--tpm", "5000", "--admin")
    assert code == 0
    secret = out.splitlines()[0].rsplit(" ", 1)[1]
    config = tmp_path / "switchboard.toml"
    config.write_text(out)  # the key's line is a TOML comment
    parsed = tomllib.loads(config.read_text())
    assert parsed["auth"]["keys"][0]["sha256"] == api_keys.digest(secret)
    (key,) = load_settings(config, environ={}).auth.keys
    assert (key.name, key.tpm, key.admin, key.rpm) == ("ci", 5000, True, None)
    assert run("keys", "list")[1].splitlines()[1:] == []  # nothing was stored in Redis


def test_without_redis_the_command_says_where_keys_can_live(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert cli.main(["keys", "add", "alice"]) == 2
    assert "--toml" in capsys.readouterr().err
    assert cli.main(["keys", "list"]) == 0  # the config's keys, and where the others would live
    out, err = capsys.readouterr()
    assert out.startswith("NAME") and "--toml" in err


@pytest.mark.parametrize("name", ["admin", "Admin", "anonymous"])
def test_a_reserved_name_is_refused(run: Run, name: str) -> None:
    """A key called `admin` was made by anyone allowed to run `keys add`, and named like the admin key."""
    for toml in ([], ["--toml"]):
        code, out, err = run("keys", "add", name, *toml)
        assert code == 1 and out == ""
        assert f"the name {name!r} is reserved" in err
    assert run("keys", "list")[1].splitlines()[1:] == []


def test_the_name_of_a_removed_key_is_never_given_again(run: Run, redis_server: PrivateRedis) -> None:
    first = run("keys", "add", "alice")[1].strip()
    code, _, err = run("keys", "remove", "alice")
    assert code == 0 and "not given to a new key" in err
    for name in ("alice", "ALICE"):
        code, out, err = run("keys", "add", name)
        assert code == 1 and out == ""
        assert "existed and was removed" in err and "alice-2" in err.lower()
    assert run("keys", "add", "alice-2")[0] == 0
    with sync_redis.Redis.from_url(redis_server.url) as client:
        assert api_keys.digest(first).encode() not in client.hgetall(keys.api_keys())


def test_names_differing_only_in_case_are_one_name(run: Run) -> None:
    assert run("keys", "add", "alice")[0] == 0
    code, _, err = run("keys", "add", "Alice")
    assert code == 1 and "exists already" in err


def stored(redis_server: PrivateRedis, name: str) -> ApiKey:
    with sync_redis.Redis.from_url(redis_server.url) as client:
        return next(k for k in api_keys.decode_stored(client.hgetall(keys.api_keys())) if k.name == name)


def test_quotas_and_team_are_stored_and_printed_for_the_config(
    run: Run, redis_server: PrivateRedis, tmp_path: Path
) -> None:
    argv = ["--tokens-per-day", "1000", "--tokens-per-month", "20000", "--team", "acme"]
    code, _, err = run("keys", "add", "alice", *argv)
    assert code == 0 and "tokens per day 1000, per month 20000; team acme" in err
    # A team the configuration has no table for counts its keys' tokens without a quota: a warning.
    assert "team 'acme' has no [auth.teams.acme] table" in err
    record = stored(redis_server, "alice")
    assert (record.tokens_per_day, record.tokens_per_month, record.team) == (1000, 20000, "acme")
    row = run("keys", "list")[1].splitlines()[1].split()
    assert row[5:8] == ["1000", "20000", "acme"]
    code, out, _ = run("keys", "add", "ci", "--toml", *argv)
    config = tmp_path / "switchboard.toml"
    config.write_text(out + "\n[auth.teams.acme]\ntokens_per_day = 5000\n")
    (key,) = load_settings(config, environ={}).auth.keys
    assert (key.tokens_per_day, key.tokens_per_month, key.team) == (1000, 20000, "acme")


def test_set_changes_a_stored_keys_limits_and_none_removes_one(run: Run, redis_server: PrivateRedis) -> None:
    run("keys", "add", "alice", "--rpm", "60", "--tokens-per-day", "1000")
    before = stored(redis_server, "alice")
    code, _, err = run(
        "keys", "set", "alice", "--tokens-per-month", "9000", "--team", "acme", "--rpm", "none"
    )
    assert code == 0 and "key 'alice' changed" in err
    after = stored(redis_server, "alice")
    assert (after.rpm, after.tokens_per_day, after.tokens_per_month, after.team) == (None, 1000, 9000, "acme")
    assert (after.sha256, after.created) == (before.sha256, before.created)  # the same key
    assert run("keys", "set", "alice", "--team", "none")[0] == 0
    assert stored(redis_server, "alice").team is None
    code, _, err = run("keys", "set", "bob", "--tpm", "5")
    assert code == 1 and "no key named 'bob'" in err
    assert run("keys", "set", "alice")[0] == 2  # nothing to change
    code, _, err = run("keys", "set", "alice", "--team", "no spaces")
    assert code == 1 and "invalid key" in err
    assert stored(redis_server, "alice").team is None


def test_service_tiers_and_batch_lines_are_stored_changed_and_printed_for_the_config(
    run: Run, redis_server: PrivateRedis, tmp_path: Path
) -> None:
    code, _, err = run("keys", "add", "gold", "--service-tiers", "priority,default", "--batch-lines", "5")
    assert code == 0, err
    record = stored(redis_server, "gold")
    assert (record.service_tiers, record.max_batch_lines_in_flight) == (["priority", "default"], 5)
    assert run("keys", "set", "gold", "--service-tiers", "flex", "--batch-lines", "none")[0] == 0
    record = stored(redis_server, "gold")
    assert (record.service_tiers, record.max_batch_lines_in_flight) == (["flex"], None)
    assert run("keys", "set", "gold", "--service-tiers", "none")[0] == 0
    assert stored(redis_server, "gold").service_tiers == []
    code, _, err = run("keys", "set", "gold", "--service-tiers", "scale")
    assert code == 1 and "invalid key" in err
    code, out, _ = run("keys", "add", "ci", "--toml", "--service-tiers", "priority", "--batch-lines", "2")
    config = tmp_path / "switchboard.toml"
    config.write_text(out + "\n")
    (key,) = load_settings(config, environ={}).auth.keys
    assert (key.service_tiers, key.max_batch_lines_in_flight) == (["priority"], 2)


def test_usage_prints_each_counted_keys_and_teams_tokens_with_quotas(
    run: Run, redis_server: PrivateRedis, tmp_path: Path
) -> None:
    config = tmp_path / "switchboard.toml"
    config.write_text("[auth.teams.acme]\ntokens_per_month = 50000\n\n[auth.teams.idle]\n")
    at = ("--config", str(config))
    alice = run(*at, "keys", "add", "alice", "--tokens-per-day", "1000", "--team", "acme")[1].strip()
    run(*at, "keys", "add", "bob")  # neither quota nor team: not counted
    periods = Periods.at(time.time())
    with sync_redis.Redis.from_url(redis_server.url) as client:
        client.set(keys.key_tokens(api_keys.digest(alice), periods.day), 120)
        client.set(keys.key_tokens(api_keys.digest(alice), periods.month), 700)
        client.set(keys.team_tokens("acme", periods.month), 900)
    code, out, _ = run(*at, "keys", "usage")
    assert code == 0
    header, *rows, footer = out.splitlines()
    assert header.split() == [
        "NAME",
        "KIND",
        "TEAM",
        "DAY",
        "USED",
        "DAY",
        "QUOTA",
        "MONTH",
        "USED",
        "MONTH",
        "QUOTA",
    ]
    assert [row.split() for row in rows] == [
        ["alice", "key", "acme", "120", "1000", "700", "-"],
        ["acme", "team", "-", "0", "-", "900", "50000"],
        ["idle", "team", "-", "0", "-", "0", "-"],
    ]
    assert f"ends at {quotas.iso_time(periods.day_ends)}" in footer
    code, out, _ = run(*at, "keys", "usage", "bob", "--json")
    (bob,) = json.loads(out)["data"]
    assert bob["day"]["used"] is None and bob["month"]["resets_at"] == quotas.iso_time(periods.month_ends)
    assert [u["kind"] for u in json.loads(run(*at, "keys", "usage", "acme", "--json")[1])["data"]] == ["team"]
    code, _, err = run(*at, "keys", "usage", "nobody")
    assert code == 1 and "no key or team named 'nobody'" in err
