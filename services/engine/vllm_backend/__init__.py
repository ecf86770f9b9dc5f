"""`maas serve engine --backend vllm`: maas.v1.Engine in front of one vLLM server.

The adapter speaks vLLM's OpenAI HTTP API (httpx, streaming) and its ZeroMQ
KV-event publisher, and serves the same gRPC contract as the native engine,
so the gateway, router, billing and operator do not know which one answers.

- request_body.py: SamplingParams, grammar and tenant salt -> a /v1/completions body
- completion_stream.py: the SSE stream -> per-sample outputs (ids, text, logprobs, usage)
- load.py: GetLoad from vLLM's /metrics and /v1/models, cached briefly
- kv_translation.py: vLLM's block hashes -> our chained hashes (services/common/block_hash.py)
- kv_subscriber.py: the ZeroMQ subscription, sequence gaps, fan-out to StreamKvEvents
- tokenizer_check.py: refuse a vLLM model whose tokenizer is not ours
- servicer.py, server.py: the gRPC side

docs/vllm-backend.md says what maps to what and what is not supported.
"""
