"""TensorRT-LLM behind the engine interface: the engine (`engine`), what it is built with and takes
(`load_plan`), its request and output mapping (`io`), what it refuses (`refusals`), and TensorRT-LLM
itself, imported once per worker (`runtime`).

Hands on what the registry makes an engine with. None of these modules imports `tensorrt_llm`
until an engine starts or the worker imports it in the background (`runtime.import_runtime`).
"""

from workers.engines.trtllm.engine import TrtllmEngine
from workers.engines.trtllm.runtime import import_runtime

__all__ = ["TrtllmEngine", "import_runtime"]
