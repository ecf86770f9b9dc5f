"""The engine core: the LLMEngine in a process of its own.

Why: on a CPU the model step and the serving loop compete for the same
cores. With both in one process the engine computed on all cores but one, so
that the event loop could stream tokens out; here the core computes on every
core it may run on, and the serving process (gRPC, proto conversion, metrics,
KV-event fan-out) runs beside it with one thread and no model work.

How (vLLM v1's shape): the serving process binds two ZeroMQ ipc:// sockets
in a private temporary directory and starts the core (launcher.py ->
process.py), which loads the model (build.py) and connects. Messages are
msgpack via msgspec (protocol.py): one per input (add, abort, KV snapshot,
shutdown), and one StepBatch per engine step carrying every request's new
tokens, text, finish and usage, the failures, the KV-cache events and the
load; plus Ready once, KV snapshots on request and the core's metrics now
and then (metrics_relay.py). Detokenization and stop strings stay in the
LLMEngine, so no token past a stop ever leaves the core.

Death: the serving process watches the core's exit (AsyncEngine._watch); if
the core dies, every open stream ends with UNAVAILABLE, health goes
NOT_SERVING and the worker exits 1 (server.py). The core dies with the
serving process: it is started through maas_tools.local.guard, which arms the
kernel's parent-death signal before exec.
"""
