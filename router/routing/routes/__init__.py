"""Routes: the table of routes and their live weights, and how they are shown."""
