"""The PyTorch pooling runner behind the engine interface: the engine (`engine`), the model's own
process (`process`), the runner in it (`runner`), its rows' inputs (`inputs`, a reranker's `pairs`)
and its heads (`heads`).

Hands on what the registry makes an engine with. None of these modules imports torch or
transformers until the model's process loads them.
"""

from workers.engines.torch_pooling.engine import TorchPoolingEngine

__all__ = ["TorchPoolingEngine"]
