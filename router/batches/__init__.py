"""The Batch API: batches of requests from an uploaded file, run in the background by one front door at a time."""
