"""What every remote store of model files does for the node cache: list a model's files, and read
one from an offset. Blocking: the cache runs them in threads, never on an event loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from switchboard.sources.files import Manifest, RemoteFile


class SourceError(RuntimeError):
    """The store refused or failed; the message names the location and says what to do."""


class SourceChanged(SourceError):
    """The file changed in the store since it was listed: its fetch starts again from a new listing."""


class ModelSource(Protocol):
    """A remote model's files in one store."""

    # The location as configured: `s3://bucket/prefix` or `hf://org/name[@revision]`.
    location: str
    # Download rates are measured per node and per this key: the store's kind and endpoint
    # ("s3 http://127.0.0.1:9000", "hf https://huggingface.co").
    rate_key: str
    # A name for the model's entry in the node cache: the same for the same location in the same
    # store, safe as one folder name.
    cache_key: str

    def list_files(self) -> Manifest:
        """List the model's files now (the network; raises SourceError)."""
        ...

    def read(self, file: RemoteFile, offset: int) -> Iterator[bytes]:
        """The file's bytes from `offset` to its end, in chunks; SourceChanged when the store now
        holds another version of it, SourceError for any other failure."""
        ...
