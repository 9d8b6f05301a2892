"""Step one of a request: its body decoded, its tools planned, its Job built, the point a resumed stream goes on from."""
