"""The models a worker may hold: one slot each (slot.py), and the set the consumer reads (slots.py)."""
