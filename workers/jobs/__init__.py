"""Jobs: taking them from the model streams, running them, writing their chunks, taking over the left."""
