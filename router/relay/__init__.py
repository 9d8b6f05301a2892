"""Result chunks to the client: the first byte, server-sent events, or one assembled answer."""
