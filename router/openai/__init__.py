"""OpenAI's wire format at the edge of the front door: request and response structs, checks and errors."""
