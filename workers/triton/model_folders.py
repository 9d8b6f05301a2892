"""A model's folder in Triton's model repository, as the worker writes it before asking Triton to load
the model: `config.pbtxt` and what runs the model.

- A generator or a pooling model on the worker's own backend (`native_backend`): a link to the built
  library, where Triton looks for a model's backend, and the file naming the socket its requests go
  to (the engine loop's, or the model process's).
- A generator or a pooling model on Triton's Python backend: the model's `model.py` (its module
  here: `generator.backend`, `pooling.backend`), in the folder of its version 1.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

from switchboard.config import BatchingConfig
from workers.triton import model_configs, native_backend
from workers.triton.generator import backend as generator_backend
from workers.triton.pooling import backend as pooling_backend


def write_native(folder: Path, config: str, library: Path, socket_file: str, socket: Path) -> None:
    """A model served by the worker's own backend: a link to `library` (not a copy: a file that a
    running Triton has loaded is never written over), and the socket's path for the backend to read
    (in `socket_file`, whose name tells the backend the model's kind)."""
    (folder / "1").mkdir(parents=True)
    (folder / native_backend.LIBRARY_NAME).symlink_to(library)
    (folder / socket_file).write_text(str(socket))
    (folder / "config.pbtxt").write_text(config)


def write_python(folder: Path, config: str, backend: ModuleType) -> None:
    """A model served by Triton's Python backend: `backend`'s file as its `model.py`."""
    (folder / "1").mkdir(parents=True)
    assert backend.__file__ is not None
    shutil.copyfile(backend.__file__, folder / "1" / "model.py")
    (folder / "config.pbtxt").write_text(config)


def write_generator(folder: Path, name: str, job_socket: Path, library: Path | None) -> None:
    """A generator's model: on the worker's own backend when its `library` is built, else on Triton's
    Python backend (`generator.backend` as its stub)."""
    if library is None:
        write_python(folder, model_configs.generator_config(name, job_socket), generator_backend)
    else:
        config = model_configs.native_generator_config(name)
        write_native(folder, config, library, native_backend.SOCKET_FILE, job_socket)


def write_pooling(
    folder: Path, name: str, batching: BatchingConfig, batch_socket: Path, library: Path | None
) -> None:
    """A pooling model's model: on the worker's own backend when its `library` is built, else on
    Triton's Python backend (`pooling.backend` as its stub)."""
    if library is None:
        write_python(folder, model_configs.pooling_config(name, batching, batch_socket), pooling_backend)
    else:
        config = model_configs.native_pooling_config(name, batching)
        write_native(folder, config, library, native_backend.POOLING_SOCKET_FILE, batch_socket)
