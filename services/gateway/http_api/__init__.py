"""The HTTP front: connection, middleware (trace, key, body), OpenAI routes, SSE/JSON answers."""
