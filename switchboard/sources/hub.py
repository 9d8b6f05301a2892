"""A model's files in a Hugging Face Hub repository (or a mirror of the Hub), through `huggingface_hub`.

`HF_TOKEN` and `HF_ENDPOINT` apply as they do for every program that uses the Hub; a model's
`storage.endpoint_url` names a mirror on top. A listing resolves the revision (a branch, a tag, or
`main`) to its commit, and every file is then read at that commit, so that one fetch never mixes two
revisions. An LFS file (the weights) is checked by the SHA-256 its pointer records, any other file
by its git blob id.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from typing import Any

from switchboard.config import StorageConfig
from switchboard.sources.files import Manifest, RemoteFile, UnsafeName, safe_name
from switchboard.sources.locations import HubLocation
from switchboard.sources.source import SourceError

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 30.0
_GATED_HELP = (
    "accept its terms on its Hub page with the account whose token is in HF_TOKEN (or set HF_TOKEN to "
    "such an account's token)"
)
_TOKEN_HELP = "set HF_TOKEN to a token that may read it (a gated or private model), or correct the name"


class HubSource:
    """One repository's files at one revision, as one model's files."""

    def __init__(self, location: HubLocation, storage: StorageConfig | None) -> None:
        from huggingface_hub import HfApi

        self._location = location
        self.location = f"hf://{location.repo}" + (f"@{location.revision}" if location.revision else "")
        endpoint = storage.endpoint_url if storage is not None else None
        self._api = HfApi(endpoint=endpoint)  # None: HF_ENDPOINT, else the Hub itself
        # The commit the last listing resolved the revision to: every file is read at it.
        self._listed_commit: str | None = None
        self.rate_key = f"hf {self._api.endpoint}"
        where = f"{self._api.endpoint}|{location.repo}|{location.revision or ''}"
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{location.repo}-{location.revision or 'main'}").strip("-")[
            :64
        ]
        self.cache_key = f"hf-{slug}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"

    def list_files(self) -> Manifest:
        """The repository's files at the revision's current commit."""
        with _hub_errors(self.location):
            info = self._api.model_info(
                self._location.repo, revision=self._location.revision, files_metadata=True
            )
        if not info.sha or not info.siblings:
            raise SourceError(f"{self.location} holds no files: correct the model's path")
        try:
            files = tuple(sorted((_file(sibling) for sibling in info.siblings), key=lambda file: file.name))
        except UnsafeName as exc:
            raise SourceError(
                f"{self.location}: {exc}; only a repository without such a file can be served"
            ) from None
        self._listed_commit = info.sha
        return Manifest(
            location=self.location,
            revision=info.sha,
            files=files,
            listed_at=time.time(),
            pinned=self._location.pinned,
        )

    def read(self, file: RemoteFile, offset: int) -> Iterator[bytes]:
        """The file's bytes from `offset`, at the commit its listing resolved (`file.version`'s)."""
        from huggingface_hub import get_session, hf_hub_url
        from huggingface_hub.utils._headers import build_hf_headers

        url = hf_hub_url(self._location.repo, file.name, revision=self._commit(), endpoint=self._api.endpoint)
        headers = build_hf_headers()
        if offset:
            headers["Range"] = f"bytes={offset}-"
        with (
            _hub_errors(self.location, file.name),
            get_session().stream(
                "GET", url, headers=headers, follow_redirects=True, timeout=TIMEOUT_S
            ) as reply,
        ):
            _check_status(
                reply.status_code, reply.headers.get("X-Error-Code", ""), f"{self.location} ({file.name})"
            )
            # A server that ignores the range answers 200 with the whole file: skip what is on disk.
            skip = offset if offset and reply.status_code == 200 else 0
            for chunk in reply.iter_bytes(CHUNK_BYTES):
                if skip:
                    taken = min(skip, len(chunk))
                    chunk, skip = chunk[taken:], skip - taken
                if chunk:
                    yield chunk

    def _commit(self) -> str:
        # The node cache lists before it reads; the configured revision is only a fallback.
        return self._listed_commit or self._location.revision or "main"


def _file(sibling: Any) -> RemoteFile:
    """A listed file: LFS ones checked by their SHA-256, the others by their git blob id. Its version
    is that digest: a file unchanged from one commit to the next is the same version (the node cache
    keeps it rather than fetching it again)."""
    name = safe_name(str(sibling.rfilename))
    if sibling.lfs is not None:
        digest = str(sibling.lfs.sha256)
        return RemoteFile(
            name=name, size=int(sibling.lfs.size), check="sha256", digest=digest, version=digest
        )
    if sibling.blob_id and sibling.size is not None:
        digest = str(sibling.blob_id)
        return RemoteFile(name=name, size=int(sibling.size), check="git-sha1", digest=digest, version=digest)
    return RemoteFile(name=name, size=int(sibling.size or 0), check="size")


def _check_status(status: int, error_code: str, what: str) -> None:
    """A download's status as a SourceError with advice (the Hub names its error in X-Error-Code)."""
    if status in (200, 206):
        return
    if error_code == "GatedRepo":
        raise SourceError(f"{what}: the model is gated; {_GATED_HELP}")
    if status in (401, 403):
        raise SourceError(f"{what}: the Hub refused access ({status}); {_TOKEN_HELP}")
    if status == 404:
        raise SourceError(f"{what}: not found on the Hub at that revision; correct the model's path")
    raise SourceError(f"{what}: the Hub answered {status}; try again later, or point HF_ENDPOINT at a mirror")


class _hub_errors:
    """`huggingface_hub`'s and the network's failures as SourceError, naming the location and what to do."""

    def __init__(self, location: str, name: str | None = None) -> None:
        self._what = f"{location} ({name})" if name else location

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        if error is None or not isinstance(error, Exception) or isinstance(error, SourceError):
            return
        from huggingface_hub import errors

        if isinstance(error, errors.RevisionNotFoundError):
            raise SourceError(
                f"{self._what}: no such revision; name a branch, tag or commit that exists"
            ) from error
        if isinstance(error, errors.GatedRepoError):
            raise SourceError(f"{self._what}: the model is gated; {_GATED_HELP}") from error
        if isinstance(error, errors.RepositoryNotFoundError):
            raise SourceError(f"{self._what}: the Hub refused the repository; {_TOKEN_HELP}") from error
        if isinstance(error, errors.HfHubHTTPError):
            raise SourceError(f"{self._what}: the Hub answered {error}") from error
        raise SourceError(
            f"cannot reach the Hub for {self._what}: {error}; check the network, or point HF_ENDPOINT (or the "
            "model's storage.endpoint_url) at a mirror"
        ) from error
