"""HubSource against a local server speaking the Hub's API (the calls huggingface_hub makes): a
revision listed at its commit with each file's check, files read at that commit from an offset, and
each refusal a SourceError that says what to do. The server itself is checked against
huggingface_hub's own download."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from switchboard.config import StorageConfig
from switchboard.sources.files import Checker, RemoteFile
from switchboard.sources.hub import HubSource
from switchboard.sources.locations import HubLocation
from switchboard.sources.source import SourceError
from tests.support.hub_server import HubServer

OpenHub = Callable[..., HubSource]


def by_name(files: tuple[RemoteFile, ...]) -> dict[str, RemoteFile]:
    return {file.name: file for file in files}


def read_all(source: HubSource, file: RemoteFile, offset: int = 0) -> bytes:
    return b"".join(source.read(file, offset))


def copy_with(tiny_model: Path, folder: Path, config: str) -> Path:
    shutil.copytree(tiny_model, folder)
    (folder / "config.json").write_text(config)
    return folder


def test_a_branch_is_listed_at_its_commit_with_each_file_checked(
    open_hub: OpenHub, hub_server: HubServer, tiny_model: Path
) -> None:
    manifest = open_hub("hf://org/tiny").list_files()
    commit = hub_server.files_at("org/tiny", "main")[0]  # type: ignore[index]
    assert (manifest.revision, manifest.pinned, manifest.location) == (commit, False, "hf://org/tiny")
    files = by_name(manifest.files)
    weights = (tiny_model / "model.safetensors").read_bytes()
    assert (files["model.safetensors"].check, files["model.safetensors"].size) == ("sha256", len(weights))
    assert files["model.safetensors"].digest == hashlib.sha256(weights).hexdigest()
    blob_id = subprocess.run(
        ["git", "hash-object", str(tiny_model / "config.json")], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (files["config.json"].check, files["config.json"].digest) == ("git-sha1", blob_id)
    assert files["sub/extra.txt"].check == "git-sha1" and files["tokenizer.json"].check == "sha256"
    assert all(file.version == file.digest for file in manifest.files)


def test_a_commit_id_is_pinned(open_hub: OpenHub, hub_server: HubServer) -> None:
    commit = hub_server.files_at("org/tiny", "main")[0]  # type: ignore[index]
    manifest = open_hub(f"hf://org/tiny@{commit}").list_files()
    assert manifest.pinned and manifest.revision == commit


def test_a_revision_with_slashes(open_hub: OpenHub, tiny_model: Path, tmp_path: Path) -> None:
    with HubServer() as server:
        server.add_repo("org/pr", tiny_model)
        proposed = server.new_commit(
            "org/pr", copy_with(tiny_model, tmp_path / "pr", '{"pr": 1}'), branch="refs/pr/1"
        )
        source = open_hub("hf://org/pr@refs/pr/1", server)
        manifest = source.list_files()
        assert manifest.revision == proposed
        assert read_all(source, by_name(manifest.files)["config.json"]) == b'{"pr": 1}'


def test_reads_from_an_offset_at_the_listed_commit_while_the_branch_moves(
    open_hub: OpenHub, tiny_model: Path, tmp_path: Path
) -> None:
    with HubServer() as server:
        first = server.add_repo("org/moving", tiny_model)
        source = open_hub("hf://org/moving", server)
        files = by_name(source.list_files().files)
        second = server.new_commit("org/moving", copy_with(tiny_model, tmp_path / "v2", '{"v": 2}'))
        assert read_all(source, files["config.json"]) == (tiny_model / "config.json").read_bytes(), (
            "still first"
        )
        weights = (tiny_model / "model.safetensors").read_bytes()
        assert read_all(source, files["model.safetensors"], 4097) == weights[4097:]
        relisted = source.list_files()
        assert (relisted.revision, first != second) == (second, True)
        unchanged = by_name(relisted.files)["model.safetensors"]
        assert unchanged.version == files["model.safetensors"].version, "a file the commit left alone"
        assert read_all(source, by_name(relisted.files)["config.json"]) == b'{"v": 2}'


def test_a_server_that_ignores_the_range_is_skipped_to_the_offset(
    open_hub: OpenHub, hub_server: HubServer, tiny_model: Path
) -> None:
    source = open_hub("hf://org/tiny")
    tokenizer = by_name(source.list_files().files)["tokenizer.json"]
    hub_server.honour_ranges = False
    try:
        got = read_all(source, tokenizer, 1234)
    finally:
        hub_server.honour_ranges = True
    assert got == (tiny_model / "tokenizer.json").read_bytes()[1234:]
    checker = Checker(tokenizer)
    checker.update((tiny_model / "tokenizer.json").read_bytes()[:1234] + got)
    assert checker.mismatch() is None


def test_a_private_model_needs_hf_token(
    open_hub: OpenHub, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with HubServer(token="hf_test_secret") as private:
        private.add_repo("org/private", tiny_model)
        source = open_hub("hf://org/private", private)
        with pytest.raises(SourceError) as refused:
            source.list_files()
        assert "hf://org/private" in str(refused.value) and "set HF_TOKEN" in str(refused.value)
        monkeypatch.setenv("HF_TOKEN", "hf_test_secret")
        config = by_name(source.list_files().files)["config.json"]
        assert read_all(source, config) == (tiny_model / "config.json").read_bytes()
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        with pytest.raises(
            SourceError, match=r"hf://org/private \(config.json\): the Hub refused access \(401\)"
        ):
            read_all(source, config)


def test_a_gated_model_says_to_accept_its_terms(open_hub: OpenHub, tiny_model: Path) -> None:
    with HubServer() as server:
        server.add_repo("org/gated", tiny_model)
        server.gate("org/gated")
        source = open_hub("hf://org/gated", server)
        config = by_name(source.list_files().files)["config.json"]
        with pytest.raises(SourceError, match=r"\(config.json\): the model is gated; accept its terms"):
            read_all(source, config)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("hf://org/tiny@v9", "hf://org/tiny@v9: no such revision"),
        ("hf://org/absent", "hf://org/absent: the Hub refused the repository; set HF_TOKEN"),
    ],
)
def test_a_wrong_repository_or_revision_says_so(open_hub: OpenHub, path: str, says: str) -> None:
    with pytest.raises(SourceError) as wrong:
        open_hub(path).list_files()
    assert says in str(wrong.value)


def test_a_file_gone_from_the_commit_says_so(open_hub: OpenHub) -> None:
    source = open_hub("hf://org/tiny")
    source.list_files()
    ghost = RemoteFile(name="ghost.bin", size=1, check="size")
    with pytest.raises(SourceError, match=r"\(ghost.bin\): not found on the Hub"):
        read_all(source, ghost)


def test_an_unreachable_hub_names_hf_endpoint(open_hub: OpenHub) -> None:
    source = HubSource(HubLocation(repo="org/tiny"), StorageConfig(endpoint_url="http://127.0.0.1:9"))
    with pytest.raises(SourceError, match="point HF_ENDPOINT"):
        source.list_files()


def test_rate_and_cache_keys(hub_server: HubServer) -> None:
    def source(revision: str | None, url: str = hub_server.url) -> HubSource:
        return HubSource(HubLocation(repo="org/tiny", revision=revision), StorageConfig(endpoint_url=url))

    assert source(None).rate_key == f"hf {hub_server.url}"
    keys = {source(None).cache_key, source("v1").cache_key, source("refs/pr/1").cache_key}
    keys.add(source(None, "http://mirror.example").cache_key)
    assert len(keys) == 4 and all("/" not in key and len(key) < 100 for key in keys)
    assert source("v1").cache_key == source("v1").cache_key


def test_huggingface_hubs_own_download_reads_the_test_server(hub_server: HubServer, tmp_path: Path) -> None:
    """The server answers what huggingface_hub asks (HEAD, then GET, its commit and ETag headers)."""
    from huggingface_hub import hf_hub_download

    for name in ("config.json", "model.safetensors"):
        path = hf_hub_download("org/tiny", name, cache_dir=tmp_path, endpoint=hub_server.url)
        expected = hub_server.files_at("org/tiny", "main")[1][name]  # type: ignore[index]
        assert Path(path).read_bytes() == expected
