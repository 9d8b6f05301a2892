"""Building the worker's own Triton backend (`workers.triton.native_backend`); what it does inside
Triton is tested against a real Triton in `test_client.py`, `test_host.py` and the end-to-end tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from workers.triton import native_backend


def test_it_builds_without_a_warning_into_a_library_with_tritons_entry_points(tmp_path: Path) -> None:
    library = native_backend.build(tmp_path / native_backend.LIBRARY_NAME)  # -Werror: a warning fails
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True
    ).stdout
    for entry in ("TRITONBACKEND_Initialize", "TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize"):
        assert entry in symbols
    assert "TRITONBACKEND_ModelInstanceExecute" in symbols
    assert os.access(library, os.X_OK)


def test_a_library_older_than_its_source_counts_as_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, header = tmp_path / "backend.c", tmp_path / "api.h"
    library = tmp_path / native_backend.LIBRARY_NAME
    source.write_text("/* the backend */")
    header.write_text("/* what it calls */")
    monkeypatch.setattr(native_backend, "SOURCE", source)
    monkeypatch.setattr(native_backend, "LIBRARY", library)
    assert native_backend.built_library() is None, "nothing built"
    library.write_bytes(b"built")
    for path in (source, header):
        os.utime(path, (1_000, 1_000))
    assert native_backend.built_library() == library
    os.utime(header, (2_000_000_000, 2_000_000_000))
    assert native_backend.built_library() is None, "the header changed since"
    os.utime(header, (1_000, 1_000))
    os.utime(source, (2_000_000_000, 2_000_000_000))
    assert native_backend.built_library() is None, "the source changed since"


def test_without_a_compiler_the_error_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native_backend.BuildError, match="set CC"):
        native_backend.build(tmp_path / native_backend.LIBRARY_NAME)
    assert not (tmp_path / native_backend.LIBRARY_NAME).exists()


def test_a_compile_error_is_reported_with_the_compilers_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("int main( {")
    monkeypatch.setattr(native_backend, "SOURCE", broken)
    with pytest.raises(native_backend.BuildError, match=r"could not build broken\.c"):
        native_backend.build(tmp_path / native_backend.LIBRARY_NAME)
