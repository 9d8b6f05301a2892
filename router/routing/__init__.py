"""Model routes at the front door: the live weights of every route, and a request's resolution."""
