"""A pooling model's Triton model: its rows and answers as they cross Triton (`model`), its
Python-backend stub (`backend`), and the consumer's client for it (`client`).

Hands on nothing: the pooling model's own process imports `backend` and `model` from here, and
should not import the client's gRPC modules with them."""
