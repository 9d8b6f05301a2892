"""A generator's Triton model: the model (`model`), its Python-backend stub (`backend`), the socket and
the loop it hands requests to the engine on (`job_socket`, `engine_thread`), the coalescing of its
output (`coalesce`, `token_pace`, `fan_in`), its output stream (`output_stream`), and the consumer's
client for it (`client`)."""
