"""`maas bench`: a load generator for any OpenAI-compatible server.

It streams chat completions over HTTP, measures what a client sees (TTFT,
TPOT, inter-token latency, end-to-end latency, throughput, errors) and reads
prefix-cache hit rates from the engines' /metrics. Workloads are scenarios,
one per file under scenarios/. Without --base-url it starts local mode once
per routing policy and runs the scenario against each, so policies are
compared on the same workload in the same run.
"""
