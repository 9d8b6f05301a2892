"""A real S3 API on loopback for tests: moto's S3 server in a thread of the test process, behind a
WSGI layer that counts the requests and can misbehave on purpose.

    with S3Store() as store:
        store.create_bucket("models")
        store.upload_folder(demo_model_dir, "models", "demo")
        env = store.env()                      # for the worker processes: credentials, endpoint
        store.object_gets("models", "demo/")   # GETs of objects under that prefix so far
        store.throttle("demo/model.safetensors", 500_000)  # serve that object at 500 kB/s
        store.corrupt("demo/model.safetensors")            # flip a byte of what is served
        store.fail("demo/config.json", times=1)            # its next GET answers 500

Counting and faults are per object key (the bucket's name first in the path), so tests that share
one store use prefixes of their own.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
from boto3.s3.transfer import TransferConfig
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from switchboard.ports import free_port

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "switchboard-tests", "AWS_SECRET_ACCESS_KEY": "switchboard-tests"}
StartResponse = Callable[..., Any]


class S3Store:
    """moto's S3 server on 127.0.0.1, with request counts and faults per object."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._gets: Counter[str] = Counter()  # object GETs per "bucket/key"
        self._ranged_gets: Counter[str] = Counter()  # those of them with a Range header
        self._bytes: Counter[str] = Counter()  # body bytes served per "bucket/key"
        self._throttled: dict[str, float] = {}  # key prefix -> bytes per second
        self._corrupt: set[str] = set()
        self._failing: dict[str, tuple[int, int | None]] = {}  # key -> (status, times left; None: always)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # --- running ----------------------------------------------------------------------------

    def __enter__(self) -> S3Store:
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(
            "127.0.0.1", self.port, self._middleware(app), threaded=True, request_handler=_QuietHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-store", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def env(self) -> dict[str, str]:
        """What a process needs to reach this store as AWS's SDK reads it (and nothing beyond it)."""
        return {
            **CREDENTIALS,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    # --- content ----------------------------------------------------------------------------

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def upload_folder(
        self, folder: Path, bucket: str, prefix: str, *, multipart_chunk_bytes: int | None = None
    ) -> None:
        """Every file of `folder` under `prefix/`; with `multipart_chunk_bytes`, files larger than
        that are uploaded in parts of that size (their ETag is then a multipart one)."""
        chunk = multipart_chunk_bytes or 64 * 1024 * 1024
        config = TransferConfig(multipart_threshold=chunk, multipart_chunksize=chunk)
        client = self.client()
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(folder).as_posix()}"
                client.upload_file(str(path), bucket, key, Config=config)

    # --- counts -----------------------------------------------------------------------------

    def object_gets(
        self, bucket: str | None = None, key_prefix: str = "", *, ranged: bool | None = None
    ) -> int:
        """GETs of objects whose key starts with `key_prefix` (in `bucket`, or any) since the last
        reset; `ranged` True or False: only those with a Range header, or only those without."""
        with self._lock:
            counts = self._gets if ranged is None else self._ranged_gets
            total = sum(n for path, n in counts.items() if _under(path, bucket, key_prefix))
            if ranged is False:
                total = sum(n for path, n in self._gets.items() if _under(path, bucket, key_prefix)) - total
            return total

    def object_bytes(self, bucket: str | None = None, key_prefix: str = "") -> int:
        """Body bytes served of those objects since the last reset."""
        with self._lock:
            return sum(n for path, n in self._bytes.items() if _under(path, bucket, key_prefix))

    def reset_counts(self) -> None:
        with self._lock:
            self._gets.clear()
            self._ranged_gets.clear()
            self._bytes.clear()

    # --- faults -----------------------------------------------------------------------------

    def throttle(self, key_prefix: str, bytes_per_s: float) -> None:
        """Serve the bodies of objects under `key_prefix` (in any bucket) at about `bytes_per_s`."""
        self._throttled[key_prefix] = bytes_per_s

    def corrupt(self, key: str) -> None:
        """Serve the object `key` (in any bucket) with its first byte flipped."""
        self._corrupt.add(key)

    def fail(self, key: str, status: int = 500, *, times: int | None = None) -> None:
        """Answer GETs of the object `key` (in any bucket) with `status` and an S3 error body: the
        next `times` of them, or all of them until `clear_faults`."""
        with self._lock:
            self._failing[key] = (status, times)

    def clear_faults(self) -> None:
        with self._lock:
            self._throttled.clear()
            self._corrupt.clear()
            self._failing.clear()

    # --- the layer in front of moto ---------------------------------------------------------

    def _middleware(self, app: Any) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
        def serve(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            path = unquote(environ.get("PATH_INFO", "")).lstrip("/")
            _, _, key = path.partition("/")
            if environ.get("REQUEST_METHOD") != "GET" or not key:
                return app(environ, start_response)  # type: ignore[no-any-return]
            with self._lock:
                self._gets[path] += 1
                if environ.get("HTTP_RANGE"):
                    self._ranged_gets[path] += 1
                status = self._take_failure(key)
            if status is not None:
                return _error_reply(status, start_response)
            body = app(environ, start_response)
            return self._served(path, key, body, first=not environ.get("HTTP_RANGE"))

        return serve

    def _take_failure(self, key: str) -> int | None:
        """The status to fail this GET of `key` with, if a fault says so (counting it down)."""
        if key not in self._failing:
            return None
        status, times = self._failing[key]
        if times is not None:
            if times <= 1:
                del self._failing[key]
            else:
                self._failing[key] = (status, times - 1)
        return status

    def _served(self, path: str, key: str, body: Iterable[bytes], *, first: bool) -> Iterator[bytes]:
        rate = next((bps for prefix, bps in self._throttled.items() if key.startswith(prefix)), None)
        corrupt = key in self._corrupt and first
        try:
            for chunk in body:
                if corrupt and chunk:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                    corrupt = False
                for piece in _pieces(chunk, rate):
                    with self._lock:
                        self._bytes[path] += len(piece)
                    yield piece
                    if rate:
                        time.sleep(len(piece) / rate)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


class _QuietHandler(MotoRequestHandler):  # type: ignore[misc]
    """moto's request handler without a log line per request."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


def _under(path: str, bucket: str | None, key_prefix: str) -> bool:
    """Whether "bucket/key" is an object of `bucket` (any, for None) whose key starts with `key_prefix`."""
    path_bucket, _, key = path.partition("/")
    return (bucket is None or path_bucket == bucket) and key.startswith(key_prefix)


def _error_reply(status: int, start_response: StartResponse) -> list[bytes]:
    """An S3 error answer, as the store sends one (`InternalError` for a 500)."""
    code = {500: "InternalError", 503: "SlowDown", 403: "AccessDenied"}.get(status, "InternalError")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>injected by the test</Message></Error>"
    ).encode()
    phrase = {500: "Internal Server Error", 503: "Slow Down", 403: "Forbidden"}.get(status, "Error")
    start_response(
        f"{status} {phrase}", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _pieces(chunk: bytes, rate: float | None) -> Iterator[bytes]:
    """A chunk in pieces of a tenth of a second each when throttled, whole otherwise."""
    if not rate:
        yield chunk
        return
    size = max(1024, int(rate / 10))
    for start in range(0, len(chunk), size):
        yield chunk[start : start + size]
