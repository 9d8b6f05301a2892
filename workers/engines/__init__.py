"""Engines behind one interface (base.py), made by name (registry.py): one folder per engine (vllm/,
trtllm/, torch_pooling/), and here what they share: prompts, sampling rules, refusals, their
processes (process_env.py, parent_death.py, the fork server) and their footprints."""
