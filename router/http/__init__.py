"""HTTP plumbing of the front door: JSON responses and the health body, and a client's disconnect noticed."""
