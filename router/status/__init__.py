"""What the front door knows of the world: where each model stands, whether Redis answers, its own heartbeat."""
