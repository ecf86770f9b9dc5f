"""The OpenAI API as maas speaks it, for every front that serves it: the
gateway's HTTP and gRPC fronts and the engine's own HTTP front (docs/gie.md).

Requests in (schemas.py: OpenAI's bodies and their bounds; parsed_request.py:
a body as the engine will run it; sampling.py, structured_output.py,
tool_calls.py; embeddings.py: the embeddings API whole), responses out
(delta.py: an engine message; openai_format.py: the chunk and response model;
sse.py: their frames; tool_parsers/: tool calls read from the text;
output_filter.py: blocked terms), and OpenAI's error envelope (errors.py,
refusal.py for an ASGI front that refuses before routing, body_shape.py for a
body refused before it is decoded). Nothing here knows about tenants,
admission or billing: those are the gateway's.
"""
