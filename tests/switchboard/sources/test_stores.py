"""Model locations, and the two remote stores against real servers on loopback: an S3 API (moto's
server) and a server speaking the Hub's file API; then the node cache fetching from each."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.config import ModelConfig, StorageConfig
from switchboard.sources.files import Checker, RemoteFile
from switchboard.sources.hub import HubSource
from switchboard.sources.locations import HubLocation, LocalFolder, S3Location, is_remote, parse_location
from switchboard.sources.node_cache import NodeCache
from switchboard.sources.s3 import S3Source
from switchboard.sources.source import SourceChanged, SourceError
from switchboard.sources.stores import source_of
from tests.support.hub_server import HubServer
from tests.support.s3_store import S3Store

PART = 5 * 1024 * 1024


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder: small files, and one of 6 MiB (two parts of a multipart upload)."""
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "tokenizer.json").write_bytes(os.urandom(3000))
    (folder / "sub").mkdir()
    (folder / "sub" / "extra.txt").write_text("x")
    (folder / "model.safetensors").write_bytes(os.urandom(PART + 1024 * 1024))
    return folder


@pytest.fixture(scope="module")
def store(model_dir: Path) -> Iterator[S3Store]:
    with S3Store() as s3:
        s3.create_bucket("models")
        s3.upload_folder(model_dir, "models", "tiny")
        s3.upload_folder(model_dir, "models", "tiny-2")
        s3.upload_folder(model_dir, "models", "parts", multipart_chunk_bytes=PART)
        yield s3


@pytest.fixture(scope="module")
def hub(model_dir: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo("org/tiny", model_dir)
        yield server


def s3_source(store: S3Store, path: str) -> S3Source:
    storage = StorageConfig(endpoint_url=store.endpoint_url, region="us-east-1")
    location = parse_location(path)
    assert isinstance(location, S3Location)
    return S3Source(location, storage)


def hub_source(hub: HubServer, path: str) -> HubSource:
    location = parse_location(path)
    assert isinstance(location, HubLocation)
    return HubSource(location, StorageConfig(endpoint_url=hub.url))


def read_all(source: S3Source | HubSource, file: RemoteFile, offset: int = 0) -> bytes:
    return b"".join(source.read(file, offset))


@pytest.fixture(autouse=True)
def credentials(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in store.env().items():
        monkeypatch.setenv(name, value)


# --- locations -------------------------------------------------------------------------------


def test_locations_of_every_kind() -> None:
    assert parse_location("/models/llama") == LocalFolder("/models/llama")
    assert parse_location("s3://models/team/llama/") == S3Location(bucket="models", prefix="team/llama")
    assert parse_location("s3://models") == S3Location(bucket="models", prefix="")
    assert parse_location("hf://org/name") == HubLocation(repo="org/name", revision=None)
    assert parse_location("hf://org/name@refs/pr/1") == HubLocation(repo="org/name", revision="refs/pr/1")
    assert parse_location(f"hf://org/name@{'a' * 40}").pinned  # type: ignore[union-attr]
    assert not parse_location("hf://org/name@main").pinned  # type: ignore[union-attr]
    assert is_remote("s3://b/p") and is_remote("hf://o/n") and not is_remote("/m")


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("s3://", "names no bucket"),
        ("s3://Bad_Bucket/x", "is not a bucket name"),
        ("s3://models/a/../b", "'..'"),
        ("hf://just-a-name", "hf://org/name"),
        ("hf://org/name@", "revision after '@' is empty"),
        ("gs://bucket/model", "not gs://"),
        ("  ", "path is empty"),
    ],
)
def test_a_wrong_location_says_what_is_wrong(path: str, says: str) -> None:
    with pytest.raises(ValueError) as wrong:
        parse_location(path)
    assert says in str(wrong.value)


def test_a_model_config_names_its_store(store: S3Store) -> None:
    assert source_of(ModelConfig(name="m", path="/models/m")) is None
    assert isinstance(source_of(ModelConfig(name="m", path="s3://models/tiny")), S3Source)
    assert isinstance(source_of(ModelConfig(name="m", path="hf://org/tiny")), HubSource)


# --- S3 --------------------------------------------------------------------------------------


def test_s3_lists_the_prefix_as_a_folder_with_each_file_checked(store: S3Store, model_dir: Path) -> None:
    manifest = s3_source(store, "s3://models/tiny").list_files()
    names = [file.name for file in manifest.files]
    assert names == ["config.json", "model.safetensors", "sub/extra.txt", "tokenizer.json"], "not tiny-2's"
    assert {file.check for file in manifest.files} == {"md5"}
    assert manifest.total_bytes == sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    assert manifest.revision == s3_source(store, "s3://models/tiny").list_files().revision


def test_a_multipart_object_is_checked_part_by_part(store: S3Store, model_dir: Path) -> None:
    source = s3_source(store, "s3://models/parts")
    weights = next(file for file in source.list_files().files if file.name == "model.safetensors")
    assert weights.check == "s3-multipart" and weights.part_size == PART and weights.digest.endswith("-2")
    checker = Checker(weights)
    checker.update(read_all(source, weights))
    assert checker.mismatch() is None
    bad = Checker(weights)
    bad.update(b"\0" + (model_dir / "model.safetensors").read_bytes()[1:])
    assert "does not match" in (bad.mismatch() or "")


def test_s3_reads_from_an_offset_of_the_version_listed(store: S3Store, model_dir: Path) -> None:
    source = s3_source(store, "s3://models/tiny-2")
    files = {file.name: file for file in source.list_files().files}
    weights = (model_dir / "model.safetensors").read_bytes()
    assert read_all(source, files["model.safetensors"], 1000) == weights[1000:]
    store.client().put_object(Bucket="models", Key="tiny-2/config.json", Body=b"{}")
    with pytest.raises(SourceChanged, match="changed in the store"):
        read_all(source, files["config.json"])


def test_s3_failures_say_what_to_do(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SourceError, match="bucket does not exist"):
        s3_source(store, "s3://missing-bucket/x").list_files()
    with pytest.raises(SourceError, match="holds no files"):
        s3_source(store, "s3://models/nothing-here").list_files()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(SourceError, match="no credentials") as refused:
        s3_source(store, "s3://models/tiny").list_files()
    assert "storage.profile" in str(refused.value)


# --- the Hub ---------------------------------------------------------------------------------


def test_the_hub_lists_a_revision_at_its_commit(hub: HubServer, model_dir: Path) -> None:
    commit = hub.files_at("org/tiny", None)[0]  # type: ignore[index]
    manifest = hub_source(hub, "hf://org/tiny").list_files()
    assert manifest.revision == commit and not manifest.pinned
    checks = {file.name: file.check for file in manifest.files}
    assert checks == {"config.json": "git-sha1", "model.safetensors": "sha256", "sub/extra.txt": "git-sha1",
                      "tokenizer.json": "sha256"}  # fmt: skip
    config = next(file for file in manifest.files if file.name == "config.json")
    blob = subprocess.run(
        ["git", "hash-object", str(model_dir / "config.json")], capture_output=True, text=True, check=True
    )
    assert config.digest == blob.stdout.strip(), "the blob id git itself computes"
    assert hub_source(hub, f"hf://org/tiny@{commit}").list_files().pinned


def test_the_hub_reads_each_file_at_the_listed_commit_from_an_offset(hub: HubServer, model_dir: Path) -> None:
    source = hub_source(hub, "hf://org/tiny")
    manifest = source.list_files()
    weights = next(file for file in manifest.files if file.name == "model.safetensors")
    data = (model_dir / "model.safetensors").read_bytes()
    assert read_all(source, weights, 4096) == data[4096:]
    checker = Checker(weights)
    checker.update(read_all(source, weights))
    assert checker.mismatch() is None and weights.digest == hashlib.sha256(data).hexdigest()


def test_the_hub_refusing_a_token_says_to_set_hf_token(
    hub: HubServer, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with HubServer(token="secret") as private:
        private.add_repo("org/private", model_dir)
        with pytest.raises(SourceError, match="HF_TOKEN"):
            hub_source(private, "hf://org/private").list_files()
        monkeypatch.setenv("HF_TOKEN", "secret")
        assert hub_source(private, "hf://org/private").list_files().files
    with pytest.raises(SourceError, match="no such revision"):
        hub_source(hub, "hf://org/tiny@v9").list_files()


# --- through the node cache ------------------------------------------------------------------


def test_the_node_cache_fetches_from_s3_once(store: S3Store, tmp_path: Path, model_dir: Path) -> None:
    cache = NodeCache(tmp_path / "cache", budget_bytes=None, recheck_s=600)
    source = s3_source(store, "s3://models/parts")
    store.reset_counts()
    with cache.fetch(source) as files:
        assert (files.folder / "model.safetensors").read_bytes() == (
            model_dir / "model.safetensors"
        ).read_bytes()
        assert (files.folder / "sub" / "extra.txt").read_text() == "x"
    gets = store.object_gets("models", "parts/")
    assert gets == 4
    with cache.fetch(source) as again:
        assert again.fetched_bytes == 0
    assert store.object_gets("models", "parts/") == gets, "a hit asks the store nothing"


def test_the_node_cache_refuses_bytes_that_fail_their_check(hub: HubServer, tmp_path: Path) -> None:
    hub.corrupt("org/tiny", "tokenizer.json")
    try:
        cache = NodeCache(tmp_path / "cache", budget_bytes=None, recheck_s=600)
        with pytest.raises(SourceError, match=r"tokenizer\.json: sha256"):
            cache.fetch(hub_source(hub, "hf://org/tiny"))
        assert not cache.cached_keys()
    finally:
        hub._corrupt.clear()


def test_a_moving_branch_is_listed_again_and_its_new_commit_fetched(model_dir: Path, tmp_path: Path) -> None:
    with HubServer() as server:
        first = server.add_repo("org/moving", model_dir)
        cache = NodeCache(tmp_path / "cache", budget_bytes=None, recheck_s=0)
        source = hub_source(server, "hf://org/moving")
        with cache.fetch(source) as old:
            assert old.manifest.revision == first
        changed = tmp_path / "v2"
        changed.mkdir()
        for path in model_dir.rglob("*"):
            if path.is_file():
                (changed / path.relative_to(model_dir)).parent.mkdir(parents=True, exist_ok=True)
                (changed / path.relative_to(model_dir)).write_bytes(path.read_bytes())
        (changed / "config.json").write_text('{"model_type": "llama", "v": 2}')
        second = server.new_commit("org/moving", changed)
        with cache.fetch(source) as new:
            assert new.manifest.revision == second
            assert (new.folder / "config.json").read_text().endswith('"v": 2}')
            assert new.fetched_bytes < sum(p.stat().st_size for p in changed.rglob("*") if p.is_file())
