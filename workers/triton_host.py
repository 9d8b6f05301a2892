"""The worker's PyTriton host: one Triton server, one decoupled model per engine it holds."""

from __future__ import annotations

import logging
import os
import sysconfig

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from switchboard.config import triton_model_name
from switchboard.ports import free_port
from workers.engines.base import Engine
from workers.triton_model import CHUNK_OUTPUT, JOB_INPUT, CoalescingPolicy, EngineCallable

logger = logging.getLogger(__name__)


def use_own_libpython() -> None:
    """Make Triton's Python backend stub load this interpreter's libpython.

    The stub links `libpython3.X.so` and would otherwise find the system's copy, which differs
    from the interpreter of pyenv, conda or a venv's base and kills the stub at model load.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir:
        return
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p != libdir]
    os.environ["LD_LIBRARY_PATH"] = ":".join([libdir, *paths])


class TritonHost:
    """Starts Triton on free ports and binds engines to it as streaming models."""

    def __init__(self, *, coalescing: CoalescingPolicy) -> None:
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self._coalescing = coalescing
        self._triton: Triton | None = None

    @property
    def grpc_address(self) -> str:
        """Where the consumer reaches this Triton over gRPC."""
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        """Launch the Triton server process (a few seconds)."""
        use_own_libpython()
        config = TritonConfig(
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            log_verbose=0,
        )
        self._triton = Triton(config=config)
        self._triton.run()
        logger.info(
            "triton started",
            extra={
                "http_port": self.http_port,
                "grpc_port": self.grpc_port,
                "metrics_port": self.metrics_port,
            },
        )

    def bind(self, model: str, engine: Engine) -> EngineCallable:
        """Serve `engine` as the decoupled Triton model `triton_model_name(model)`."""
        assert self._triton is not None, "start() the host before binding models"
        callable_ = EngineCallable(engine, self._coalescing)
        self._triton.bind(
            model_name=triton_model_name(model),
            infer_func=callable_,
            inputs=[Tensor(name=JOB_INPUT, dtype=np.bytes_, shape=(1,))],
            outputs=[Tensor(name=CHUNK_OUTPUT, dtype=np.bytes_, shape=(1,))],
            config=ModelConfig(decoupled=True, batching=False),
            strict=False,
        )
        return callable_

    def stop(self) -> None:
        """Stop Triton and every model bound to it; idempotent."""
        if self._triton is not None:
            self._triton.stop()
            self._triton = None
