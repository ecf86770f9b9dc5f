"""Other inference servers run beside ours: vLLM (an engine backend, and a peer in
benchmarks) and llama.cpp's server (a peer in benchmarks).

Each lives in its own venv (their pins clash with ours: vLLM's fastapi and
transformers bounds) under the model cache, built once on first use
(maas_tools.peers.venv), and runs as its own process (maas_tools.peers.vllm_server).
"""
