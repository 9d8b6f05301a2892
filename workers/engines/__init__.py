"""Engines behind one interface (base.py), made by name (registry.py): vLLM and TensorRT-LLM, and their processes."""
