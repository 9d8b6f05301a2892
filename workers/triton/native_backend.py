"""The worker's own Triton backend, for generators and pooling models: `native/switchboard_backend.c`
and `native/pooling.c`, built into a shared library that Triton loads in its own process.

A generator's Triton model hands each request to the worker's engine loop over a Unix socket. Through
Triton's Python backend that takes a stub process per model: Triton passes each request to the stub
through shared memory, the stub's Python sends it on, and its threads send the answers back the same
way. This backend does the same inside tritonserver, in C: a request goes from Triton's model thread
straight onto the socket, and the answers from the socket straight to Triton's response factory. Same
socket, same framing (`generator.backend`), same engine loop (`generator.job_socket`); one process and two
hand-overs fewer per job, and a model loads in milliseconds instead of the stub's start.

A pooling model's batches go the same way to the model's process (`pooling.c`, the exchange of
`pooling.backend`). No stub means no shared memory either: Triton's Python backend hands every batch
to its stub through a region in /dev/shm that it makes readable by every local user (mode 0644, set
explicitly) until the worker closes it, and a process that opened it in that moment kept reading
every later batch of the model. With this backend built, no region of the worker's exists at all.

`make install` builds it (`python -m workers.triton.native_backend`); the images build it into the
package. Without a build (no C compiler where the worker was installed) both kinds go through the
Python backend as before (its regions closed by `shm_regions` as they appear), and the worker says so
at its start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BACKEND_NAME = "switchboard"
# The backend's entry points; every C file beside it is part of the backend, and `triton_api.h`
# declares what it calls of Triton's API.
SOURCE = Path(__file__).parent / "native" / "switchboard_backend.c"
# Where Triton looks for a model's backend: `libtriton_<backend>.so` in the model's folder.
LIBRARY_NAME = f"libtriton_{BACKEND_NAME}.so"
LIBRARY = SOURCE.with_name(LIBRARY_NAME)
# The file in a generator's folder that names the engine loop's socket (the backend reads it at load).
SOCKET_FILE = "job_socket"
# The file in a pooling model's folder that names its model process's socket (`backend.h`).
POOLING_SOCKET_FILE = "batch_socket"

COMPILE_FLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread"]


class BuildError(RuntimeError):
    """The backend could not be built; the message says what to do."""


def built_library() -> Path | None:
    """The built backend, if it is there and not older than its sources; None otherwise."""
    if not LIBRARY.is_file():
        return None
    built = LIBRARY.stat().st_mtime
    if any(source.stat().st_mtime > built for source in _sources()):
        return None
    return LIBRARY


def _sources() -> list[Path]:
    """The backend's sources and the headers beside them (Triton's API as far as it uses it)."""
    return sorted(SOURCE.parent.glob("*.[ch]"))


def _c_files() -> list[Path]:
    """What the compiler is given: every C file of the backend, its entry points first."""
    return [SOURCE, *(path for path in sorted(SOURCE.parent.glob("*.c")) if path != SOURCE)]


def build(output: Path = LIBRARY) -> Path:
    """Compile the backend into `output` (written whole, then moved into place: a Triton that has the
    old file loaded keeps it)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError(
            "no C compiler to build the worker's Triton backend: install one (Debian: "
            "apt-get install gcc libc6-dev), then run `python -m workers.triton.native_backend`"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        built = Path(scratch) / output.name
        try:
            result = subprocess.run(
                [compiler, *COMPILE_FLAGS, "-o", str(built), *map(str, _c_files())],
                capture_output=True,
                text=True,
            )
        except OSError as exc:
            raise BuildError(
                f"the C compiler {compiler} could not run ({exc}); set CC to one that can"
            ) from None
        if result.returncode != 0:
            raise BuildError(f"{compiler} could not build {SOURCE.name}:\n{result.stderr.strip()}")
        built.chmod(0o755)
        built.replace(output)
    return output


def main() -> None:
    """Build the backend unless it is built already (`--force`: build it anyway)."""
    if "--force" not in sys.argv[1:] and built_library() is not None:
        print(f"The worker's Triton backend is up to date ({LIBRARY})")
        return
    try:
        print(f"Built the worker's Triton backend: {build()}")
    except BuildError as exc:
        raise SystemExit(f"install: {exc}") from None


if __name__ == "__main__":
    main()
