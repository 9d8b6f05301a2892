"""The PyTriton hop: the host, the client, the decoupled model and its coalescing of chunks."""
