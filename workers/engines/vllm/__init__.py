"""vLLM behind the engine interface: the engine (`engine`), its request and output mapping (`io`),
its tool-call parsing (`tools`), vLLM imported once per worker (`runtime`), and EngineCores forked
from the worker's fork server (`forked_core`).

Hands on what the registry makes an engine with. None of these modules imports vLLM itself until
an engine starts or the worker imports it in the background (`runtime.import_runtime`).
"""

from workers.engines.vllm.engine import VllmEngine
from workers.engines.vllm.runtime import import_runtime

__all__ = ["VllmEngine", "import_runtime"]
