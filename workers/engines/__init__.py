"""Engines behind one interface (base.py), made by name (registry.py): vLLM, and its processes."""
