"""A local server speaking the Hugging Face Hub's file API, for tests of `hf://` models.

It answers what `huggingface_hub` asks of the Hub for one model: `GET /api/models/{repo}[/revision/
{rev}]` (the repository's commit and files, with sizes, blob ids and LFS SHA-256 when `blobs` is
asked) and `GET|HEAD /{repo}/resolve/{rev}/{path}` (a file at a revision, ranges honoured), with the
headers the Hub sends (`X-Repo-Commit`, `ETag`, `X-Linked-Etag`, `X-Linked-Size`). Files of 1 KiB or
more are LFS files, as weights are on the Hub; smaller ones are plain git blobs.

    with HubServer() as hub:
        commit = hub.add_repo("org/demo", demo_model_dir)   # branch "main" at a first commit
        env = hub.env()                                     # HF_ENDPOINT for the worker processes
        hub.file_gets("org/demo")                           # file downloads so far
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_FROM_BYTES = 1024
_MODEL_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class HubServer:
    """Test repositories served over the Hub's file API on 127.0.0.1."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        # False: answer a ranged GET with the whole file and a 200, as a server that ignores ranges does.
        self.honour_ranges = True
        # repo -> commit -> {path: bytes}; repo -> branch -> commit
        self._commits: dict[str, dict[str, dict[str, bytes]]] = {}
        self._branches: dict[str, dict[str, str]] = {}
        self._gets: Counter[str] = Counter()
        self._corrupt: set[tuple[str, str]] = set()
        self._gated: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-server", daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def env(self) -> dict[str, str]:
        """What a process needs to read this server as the Hub."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            **({"HF_TOKEN": self.token} if self.token else {}),
        }

    def add_repo(self, repo: str, folder: Path) -> str:
        """A repository whose branch "main" holds `folder`'s files; its commit id."""
        self._commits[repo] = {}
        self._branches[repo] = {}
        return self.new_commit(repo, folder)

    def new_commit(self, repo: str, folder: Path, *, branch: str = "main") -> str:
        """Move `branch` ("main", or a ref such as "refs/pr/1") to a new commit holding `folder`'s
        files; its commit id."""
        files = {
            p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(Path(folder).rglob("*"))
            if p.is_file()
        }
        listing = "".join(f"{name}\0{_git_blob_id(data)}\n" for name, data in files.items())
        commit = hashlib.sha1(
            f"{repo}\n{len(self._commits[repo])}\n{listing}".encode(), usedforsecurity=False
        ).hexdigest()
        with self._lock:
            self._commits[repo][commit] = files
            self._branches[repo][branch] = commit
        return commit

    def file_gets(self, repo: str) -> int:
        """File downloads (GETs of `resolve/`) from `repo` so far."""
        with self._lock:
            return sum(n for key, n in self._gets.items() if key.startswith(f"{repo}/"))

    def corrupt(self, repo: str, path: str) -> None:
        """Serve `path` of `repo` with its first byte flipped (its listing unchanged)."""
        self._corrupt.add((repo, path))

    def gate(self, repo: str) -> None:
        """Refuse `repo`'s files as the Hub refuses a gated model's to an account that has not accepted
        its terms (403, `X-Error-Code: GatedRepo`); its listing stays readable, as on the Hub."""
        self._gated.add(repo)

    # --- what the handler asks --------------------------------------------------------------

    def files_at(self, repo: str, revision: str | None) -> tuple[str, dict[str, bytes]] | None:
        commits = self._commits.get(repo)
        if commits is None:
            return None
        commit = self._branches[repo].get(revision or "main", revision or "")
        return (commit, commits[commit]) if commit in commits else None

    def count_get(self, repo: str, path: str) -> None:
        with self._lock:
            self._gets[f"{repo}/{path}"] += 1

    def served(self, repo: str, path: str, data: bytes) -> bytes:
        if (repo, path) in self._corrupt and data:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _sibling(name: str, data: bytes) -> dict[str, Any]:
    sibling: dict[str, Any] = {"rfilename": name, "size": len(data), "blobId": _git_blob_id(data)}
    if len(data) >= LFS_FROM_BYTES:
        sibling["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        sibling["size"] = len(data)
    return sibling


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self._send(
                    401, b'{"error": "Invalid credentials"}', {"X-Error-Code": "RepoNotFound"}, body=body
                )
                return
            # Matched before unquoting: a revision such as refs/pr/1 comes quoted whole (refs%2Fpr%2F1).
            path = urlsplit(self.path).path
            if info := _MODEL_INFO.match(path):
                revision = unquote(info["rev"]) if info["rev"] else None
                self._model_info(unquote(info["repo"]), revision, body=body)
            elif resolve := _RESOLVE.match(path):
                self._file(
                    unquote(resolve["repo"]), unquote(resolve["rev"]), unquote(resolve["path"]), body=body
                )
            else:
                self._send(404, b'{"error": "not found"}', {}, body=body)

        def _model_info(self, repo: str, revision: str | None, *, body: bool) -> None:
            found = hub.files_at(repo, revision)
            if found is None:
                code = "RevisionNotFound" if repo in hub._commits else "RepoNotFound"
                self._send(404, b'{"error": "not found"}', {"X-Error-Code": code}, body=body)
                return
            commit, files = found
            info = {
                "id": repo,
                "modelId": repo,
                "sha": commit,
                "siblings": [_sibling(n, d) for n, d in files.items()],
            }
            self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body=body)

        def _file(self, repo: str, revision: str, name: str, *, body: bool) -> None:
            found = hub.files_at(repo, revision)
            if found is None or name not in found[1]:
                code = (
                    "EntryNotFound"
                    if found
                    else "RevisionNotFound"
                    if repo in hub._commits
                    else "RepoNotFound"
                )
                self._send(404, b'{"error": "not found"}', {"X-Error-Code": code}, body=body)
                return
            if repo in hub._gated:
                message = b'{"error": "Access to this model is restricted: accept its conditions"}'
                self._send(403, message, {"X-Error-Code": "GatedRepo"}, body=body)
                return
            commit, files = found
            data = files[name]
            sibling = _sibling(name, data)
            etag = sibling["lfs"]["sha256"] if "lfs" in sibling else sibling["blobId"]
            headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if "lfs" in sibling:
                headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
            if body:
                hub.count_get(repo, name)
            served = hub.served(repo, name, data)
            ranged = hub.honour_ranges and re.match(r"^bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
            if ranged and int(ranged[1]) >= len(data):
                headers["Content-Range"] = f"bytes */{len(data)}"
                self._send(416, b"", headers, body=body)
            elif ranged:
                start = int(ranged[1])
                end = min(int(ranged[2]), len(data) - 1) if ranged[2] else len(data) - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                self._send(206, served[start : end + 1], headers, body=body)
            else:
                self._send(200, served, headers, body=body)

        def _send(self, status: int, payload: bytes, headers: dict[str, str], *, body: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                with contextlib.suppress(ConnectionError):  # a client that read enough and left
                    self.wfile.write(payload)

    return Handler
