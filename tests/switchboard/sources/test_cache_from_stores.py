"""The node cache fetching from the two remote stores, each a real server on loopback: an S3 API
(moto's server) and a server speaking the Hub's file API. The stores alone: test_s3.py, test_hub.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.config import ModelConfig, StorageConfig
from switchboard.sources.files import RemoteFile
from switchboard.sources.hub import HubSource
from switchboard.sources.locations import HubLocation, S3Location, parse_location
from switchboard.sources.node_cache import NodeCache
from switchboard.sources.s3 import S3Source
from switchboard.sources.source import SourceError
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


def test_a_model_config_names_its_store(store: S3Store) -> None:
    assert source_of(ModelConfig(name="m", path="/models/m")) is None
    assert isinstance(source_of(ModelConfig(name="m", path="s3://models/tiny")), S3Source)
    assert isinstance(source_of(ModelConfig(name="m", path="hf://org/tiny")), HubSource)


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
