"""A real OpenTelemetry collector on loopback, and a place to read what it received.

The collector is rotel's (the `rotel` wheel bundles the binary): services
export OTLP/gRPC to it, and it forwards every batch over OTLP/gRPC to a
TraceService sink in this process, where the test reads the spans. Going
through rotel proves the services speak the protocol a real deployment's
collector speaks, not just whatever the sink would accept.
"""

import socket
import subprocess
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from maas_tools.local.ports import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    events: tuple[str, ...]
    attributes: dict


def _value(any_value):
    return (
        getattr(any_value, any_value.WhichOneof("value")) if any_value.WhichOneof("value") else None
    )


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []

    def Export(self, request, context):
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=resource.get("service.name", ""),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            events=tuple(e.name for e in span.events),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self._spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if s.trace_id == trace_id]


def _wait_listening(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rotel exited {process.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"rotel did not listen on {port} in {timeout}s: {log.read_text()}")


class Collector:
    """rotel listening on `endpoint`, forwarding to an in-process sink."""

    def __init__(self, agent: Path, workdir: Path):
        self.sink = Sink()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.sink, self._server)
        sink_port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self._log = workdir / "rotel.log"
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    str(agent),
                    "start",
                    f"--otlp-grpc-endpoint=127.0.0.1:{port}",
                    f"--otlp-http-endpoint=127.0.0.1:{free_port()}",
                    "--exporter=otlp",
                    f"--otlp-exporter-endpoint=http://127.0.0.1:{sink_port}",
                    "--otlp-exporter-protocol=grpc",
                    "--otlp-exporter-compression=none",
                    "--batch-timeout=100ms",
                    f"--pid-file={workdir / 'rotel.pid'}",
                    f"--log-file={self._log}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_listening(port, self._process, self._log, timeout=30)
        except BaseException:
            self.stop()
            raise

    def wait_for(self, trace_id: str, done, timeout: float) -> list[ReceivedSpan]:
        """The trace's spans once `done(spans)` holds; what arrived so far on timeout."""
        deadline = time.monotonic() + timeout
        spans = self.sink.trace(trace_id)
        while not done(spans) and time.monotonic() < deadline:
            time.sleep(0.2)
            spans = self.sink.trace(trace_id)
        return spans

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._server.stop(grace=None)
