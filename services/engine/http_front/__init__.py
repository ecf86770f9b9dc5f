"""The engine's OpenAI HTTP front, for gateways that front model servers themselves.

A Gateway API Inference Extension gateway (GIE, llm-d) sends OpenAI requests
straight to a pod its endpoint picker chose from an InferencePool; maas's own
gateway sends token ids over gRPC. This package serves the first kind in the
engine's own process, on its own port (EngineSettings.http_port), through the
same AsyncEngine, so both kinds share one scheduler, one batch and one KV cache.
docs/gie.md says how to set it up and what it leaves out (tenants, limits,
billing: they are maas's gateway's).
"""
