"""`switchboard adapters list | add | add --file | rm` against a real front door's `/admin/adapters`,
with real Redis: what is registered, listed and removed, what a refusal prints, and a catalogue's
file read line by line (stopping at the first refusal, or going on past it)."""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from switchboard import api_keys as key_secrets
from switchboard import keys
from switchboard.cli import main as cli
from switchboard.cli.adapters import read_entries, render_adapters
from switchboard.config import ApiKey, LoraConfig, ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from tests.support.front_door_harness import serving, settings_for

Run = Callable[..., Awaitable[tuple[int, str, str]]]
SECRET = key_secrets.new_secret()


@pytest.fixture
async def front_door(redis_server: PrivateRedis, redis: aioredis.Redis) -> AsyncIterator[str]:
    """A real front door with two bases that take adapters, one that takes none, and an adapter of
    the config; an admin key is needed. Yields its URL."""
    models = [
        ModelConfig(name="llama", path="/nonexistent/llama", lora=LoraConfig()),
        ModelConfig(name="mistral", path="/nonexistent/mistral", lora=LoraConfig()),
        ModelConfig(name="plain", path="/nonexistent/plain"),
        ModelConfig(name="cfg-ft", base="llama", path="/nonexistent/cfg-ft", keep_alive_s=-1),
    ]
    settings = settings_for(redis_server.url, models=models)
    settings.auth.keys = [ApiKey(name="ops", sha256=key_secrets.digest(SECRET), admin=True)]
    async with serving(settings) as client:
        yield str(client.base_url)


@pytest.fixture
def run(front_door: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """`switchboard adapters ARGS --url <the front door>` (in a thread: the front door runs in this
    loop) with the admin key in the environment; returns (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    monkeypatch.setenv(cli.ADMIN_KEY_ENV, SECRET)

    async def invoke(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(cli.main, ["adapters", "--url", front_door, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def cells(table: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line) for line in table.splitlines()]


async def test_adapters_are_added_listed_by_base_and_removed(
    run: Run, redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "acme/support-v3"
    store = ["--endpoint-url", "http://minio:9000", "--region", "eu-west-1"]
    code, out, err = await run("add", name, "--base", "llama", "--path", "s3://acme/support-v3", *store,
                               "--keep-alive-s", "600", "--priority", "2")  # fmt: skip
    assert (code, err) == (0, "")
    assert cells(out) == [
        ["NAME", "BASE", "SOURCE", "PATH", "KEEP-ALIVE"],
        [name, "llama", "admin", "s3://acme/support-v3", "10 min"],
    ]
    raw = await redis.hget(keys.adapters(), name)  # type: ignore[misc]
    assert raw is not None
    stored = msgspec.json.decode(raw, type=ModelConfig)
    assert stored.storage is not None and stored.priority == 2
    assert (stored.storage.endpoint_url, stored.storage.region) == ("http://minio:9000", "eu-west-1")
    for adapter, base in (("zeta", "llama"), ("alpha", "mistral")):
        assert (await run("add", adapter, "--base", base, "--path", f"/adapters/{adapter}"))[0] == 0

    code, out, _ = await run("list")
    assert code == 0 and cells(out) == [
        ["NAME", "BASE", "SOURCE", "PATH", "KEEP-ALIVE"],
        [name, "llama", "admin", "s3://acme/support-v3", "10 min"],
        ["cfg-ft", "llama", "config", "/nonexistent/cfg-ft", "never leaves"],
        ["zeta", "llama", "admin", "/adapters/zeta", "5 min"],
        ["alpha", "mistral", "admin", "/adapters/alpha", "5 min"],
    ]

    # Refusals: the front door's reason, and the exit code 1; a command short of fields is a 2.
    code, out, err = await run("add", "x", "--base", "plain", "--path", "/adapters/x")
    assert (code, out) == (1, "") and "answered 400" in err and "[models.lora] table" in err
    code, _, err = await run("add", "zeta", "--base", "llama", "--path", "/adapters/zeta")
    assert code == 1 and "answered 409" in err and "remove it first or choose another" in err
    code, _, err = await run("add", "x", "--base", "llama")
    assert code == 2 and "needs --path" in err and "--file FILE" in err

    code, out, err = await run("rm", name, "cfg-ft", "nope")
    assert code == 1 and out == f"adapter {name} removed\n"
    assert "answered 409" in err and "remove it from the config file instead" in err
    assert "answered 404" in err and "`nope` does not exist" in err
    assert "2 of 3 adapter(s) not removed; `switchboard adapters list` shows" in err
    assert not await redis.hexists(keys.adapters(), name)  # type: ignore[misc]
    assert (await run("rm", "zeta", "alpha")) == (0, "adapter zeta removed\nadapter alpha removed\n", "")

    monkeypatch.delenv(cli.ADMIN_KEY_ENV)
    code, out, err = await run("list")
    assert (code, out) == (1, "") and "answered 401" in err and "Pass an admin key with --key" in err
    code, out, _ = await run("list", "--key", SECRET)
    assert code == 0 and [row[0] for row in cells(out)] == ["NAME", "cfg-ft"]


async def test_a_catalogue_stops_at_its_first_refused_line_and_a_rerun_goes_on_where_it_stopped(
    run: Run, redis: aioredis.Redis, tmp_path: Path
) -> None:
    entries = [
        {"name": f"acme/ft-{n:03}", "base": "llama", "path": f"s3://acme/ft-{n:03}"} for n in range(250)
    ]
    entries[149]["base"] = "plain"  # line 150: a base that takes no adapters
    catalogue = tmp_path / "catalogue.jsonl"
    catalogue.write_text("".join(json.dumps(entry) + "\n" for entry in entries))

    code, out, err = await run("add", "--file", str(catalogue))
    assert code == 1
    assert (
        out == f"149 adapter(s) registered from {catalogue}, 0 registered already, 1 failed, of 250 entries\n"
    )
    assert "  100 of 250 entries: 100 registered, 0 registered already, 0 failed" in err
    assert f"{catalogue}:150: adapter 'acme/ft-149' was not registered" in err
    assert f"stopped at {catalogue}:150" in err and "--keep-going" in err
    assert await redis.hlen(keys.adapters()) == 149  # type: ignore[misc]

    code, out, err = await run("add", "--file", str(catalogue), "--keep-going")
    assert code == 1
    assert (
        out
        == f"100 adapter(s) registered from {catalogue}, 149 registered already, 1 failed, of 250 entries\n"
    )
    assert f"1 entries failed ({catalogue}:150); fix them and run the same command again" in err
    assert await redis.hlen(keys.adapters()) == 249  # type: ignore[misc]

    toml = tmp_path / "catalogue.toml"
    toml.write_text(
        '# fixed\n[[adapters]]\nname = "acme/ft-149"\nbase = "llama"\npath = "s3://acme/ft-149"\n\n'
        '[[adapters]]\nname = "acme/ft-250"\nbase = "llama"\npath = "s3://acme/ft-250"\nkeep_alive_s = 60\n'
        'storage = { region = "eu-west-1" }\n\n'
        '[[adapters]]\nname = "acme/ft-251"\nbase = "llama"\npath = "/a"\nengine = "vllm"\n'
    )
    code, out, err = await run("add", "--file", str(toml), "--keep-going")
    assert code == 1 and out.startswith("2 adapter(s) registered") and "1 failed, of 3 entries" in out
    assert f"{toml}:14: adapter 'acme/ft-251' was not registered" in err
    assert "answered 400" in err and "remove engine (set them on 'llama')" in err
    assert await redis.hlen(keys.adapters()) == 251  # type: ignore[misc]

    code, _, err = await run("add", "--file", str(tmp_path / "none.jsonl"))
    assert code == 2 and "cannot read adapters from" in err
    code, _, err = await run("add", "--file", str(catalogue), "--base", "llama")
    assert code == 2 and "leave out --base" in err


def test_a_catalogue_file_is_json_lines_or_adapters_tables_each_entry_with_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"name": "a"}\n\n[1]\n{"name": \n')
    good, not_object, broken = read_entries(path)
    assert (good.where, good.fields) == (f"{path}:1", {"name": "a"})
    assert not_object.where == f"{path}:3" and "expected an object" in str(not_object.problem)
    assert broken.where == f"{path}:4" and "not JSON" in str(broken.problem)
    monkeypatch.setattr("sys.stdin", io.StringIO('[[adapters]]\nname = "a"\n  [[ adapters ]]\nname = "b"\n'))
    assert [(e.where, e.fields) for e in read_entries(Path("-"))] == [
        ("stdin:1", {"name": "a"}),
        ("stdin:3", {"name": "b"}),
    ]
    # Tables without headers of their own are counted instead.
    path = tmp_path / "c.toml"
    path.write_text('adapters = [{name = "a"}, {name = "b"}]\n')
    assert [e.where for e in read_entries(path)] == [f"{path}, adapter 1", f"{path}, adapter 2"]
    for text, message in (
        ("", "holds no adapters"),
        ('[[models]]\nname = "a"\n', "(name, base, path...); it has models"),
        ("[[adapters]\n", "not TOML"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=re.escape(message)):
            read_entries(path)


def test_nothing_listening_says_how_to_start_a_front_door(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    url = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["adapters", "list", "--url", url]) == 1
    assert "switchboard up" in capsys.readouterr().err
    assert (
        cli.main(["adapters", "add", "x", "--base", "b", "--path", "/p", "--keep-going", "--url", url]) == 2
    )
    assert "--keep-going is for --file" in capsys.readouterr().err
    assert render_adapters([]) == "NAME  BASE  SOURCE  PATH  KEEP-ALIVE\n"
