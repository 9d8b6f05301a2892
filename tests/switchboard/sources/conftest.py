"""A tiny model folder, and the two stores that serve it on loopback: moto's S3 server and a server
speaking the Hub's file API. Both live for the whole session; each test reads prefixes or
repositories of its own where it changes what they hold."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from switchboard.config import StorageConfig
from switchboard.sources.hub import HubSource
from switchboard.sources.locations import HubLocation, S3Location, parse_location
from switchboard.sources.s3 import S3Source
from tests.support.hub_server import HubServer
from tests.support.s3_store import S3Store

# moto, like S3, takes parts of at least 5 MiB (but the last).
PART_BYTES = 5 * 1024 * 1024
BUCKET = "models"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model's folder without real weights: small files (git blobs on the Hub) and larger ones
    (LFS there), the largest of two multipart parts."""
    folder = tmp_path_factory.mktemp("tiny-model")
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    (folder / "tokenizer.json").write_bytes(os.urandom(3000))
    (folder / "sub").mkdir()
    (folder / "sub" / "extra.txt").write_text("x")
    (folder / "model.safetensors").write_bytes(os.urandom(PART_BYTES + 1024 * 1024))
    return folder


@pytest.fixture(scope="session")
def s3_store(tiny_model: Path) -> Iterator[S3Store]:
    """Bucket `models`: the tiny model at `tiny`, again at `tiny-2`, and at `parts` uploaded in parts."""
    with S3Store() as store:
        store.create_bucket(BUCKET)
        store.upload_folder(tiny_model, BUCKET, "tiny")
        store.upload_folder(tiny_model, BUCKET, "tiny-2")
        store.upload_folder(tiny_model, BUCKET, "parts", multipart_chunk_bytes=PART_BYTES)
        yield store


@pytest.fixture
def aws_env(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    """The store's credentials, region and endpoint in the environment, as a worker would have them,
    and no shared AWS files of this machine's."""
    for name, value in s3_store.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    s3_store.clear_faults()
    return s3_store


@pytest.fixture
def open_s3(aws_env: S3Store) -> Callable[[str], S3Source]:
    """An S3Source for an `s3://` path in the test store (its endpoint from the model's storage table)."""

    def open_path(path: str) -> S3Source:
        location = parse_location(path)
        assert isinstance(location, S3Location)
        return S3Source(location, StorageConfig(endpoint_url=aws_env.endpoint_url))

    return open_path


@pytest.fixture(scope="session")
def hub_server(tiny_model: Path) -> Iterator[HubServer]:
    """Repository `org/tiny` holding the tiny model on branch main."""
    with HubServer() as server:
        server.add_repo("org/tiny", tiny_model)
        yield server


@pytest.fixture
def open_hub(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., HubSource]:
    """A HubSource for an `hf://` path on a test Hub server (the session's unless another is given)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)

    def open_path(path: str, server: HubServer = hub_server) -> HubSource:
        location = parse_location(path)
        assert isinstance(location, HubLocation)
        return HubSource(location, StorageConfig(endpoint_url=server.url))

    return open_path
