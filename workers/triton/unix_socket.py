"""Triton's gRPC endpoint on a Unix socket, which only the worker's user can open.

On a TCP port of 127.0.0.1 every local user could send Triton jobs, or load a Python model that
runs code as the worker. Triton can require a header on some APIs (`--grpc-restricted-protocol`),
but only with the expected value on its command line, which every local user can read in
/proc/PID/cmdline; Triton reads those options from no file and no environment variable. A Unix
socket in a folder of mode 0700 leaves nothing to guess: the kernel refuses every other user at
`connect` (no permission to search the folder), so Triton needs no token at all.

Triton joins the address and the port as `<address>:<port>`, so the socket file is
`<folder>/grpc:<port>` and gRPC clients reach it as `unix:<folder>/grpc:<port>`. PyTriton 0.7
reads its Triton's URL as `scheme://host:port`, which a Unix path does not fit; `teach_pytriton`
lets its URL parser pass such an address through whole.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from pytriton.client import utils as pytriton_client_utils
from pytriton.client.warnings import NotSupportedTimeoutWarning

# The "port" in the socket's name: Triton wants a number, and gRPC reports 1 for every Unix socket.
SOCKET_PORT = 1
# sun_path holds 108 bytes, the last one the terminating zero.
MAX_SOCKET_PATH_BYTES = 107
_SCHEME = "grpc://"
_UNIX = "unix:"


def socket_address(folder: Path) -> str:
    """What Triton is given as its gRPC address (it adds `:<port>`)."""
    return f"{_UNIX}{folder}/grpc"


def client_target(folder: Path) -> str:
    """The gRPC target that reaches Triton's socket in `folder`."""
    return f"{socket_address(folder)}:{SOCKET_PORT}"


def check_length(folder: Path) -> None:
    """Refuse a socket path longer than Linux allows (gRPC's own error would not say why)."""
    path = client_target(folder).removeprefix(_UNIX)
    if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
        raise RuntimeError(
            f"the path of Triton's socket, {path}, is longer than {MAX_SOCKET_PATH_BYTES} bytes; "
            "point TMPDIR to a shorter folder"
        )


def teach_pytriton() -> None:
    """Let PyTriton's URL parser take `grpc://unix:<path>:<port>` (idempotent)."""
    url_class: Any = pytriton_client_utils.TritonUrl
    if getattr(url_class, "_switchboard_unix", False):
        return
    parse = url_class.from_url.__func__

    def from_url(cls: Any, url: Any) -> Any:
        if isinstance(url, str) and url.startswith(_SCHEME + _UNIX):
            # hostname carries the whole `unix:<path>`, so that `without_scheme` is the gRPC target.
            path, _, port = url[len(_SCHEME) :].rpartition(":")
            return cls(scheme="grpc", hostname=path, port=int(port))
        return parse(cls, url)

    url_class.from_url = classmethod(from_url)
    url_class._switchboard_unix = True
    # Its gRPC clients (model load and unload, here) say at each start that they keep no timeout
    # but the inference one: true, and nothing to act on.
    warnings.filterwarnings("ignore", category=NotSupportedTimeoutWarning)
