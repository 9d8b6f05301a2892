"""Who may send what: the caller's key, the model it names, its limits, whether it fits the model, a live worker for it."""
