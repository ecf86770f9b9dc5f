"""What an unauthenticated or hostile HTTP client can cost a real gateway process.

A gateway of its own, over the session's Redis, with short deadlines; its
tokenizer and router are unreachable, which none of these requests get to.
Memory is the process's peak RSS (VmHWM), reset before each request.
"""

import socket
from pathlib import Path

import httpx
import pytest

from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from tests.e2e.tenants import new_tenant_key

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
MAX_BODY = 4 * MiB
JSON = {"content-type": "application/json"}


class Gateway:
    def __init__(self, process: ManagedProcess, url: str, port: int, metrics_url: str, key: str):
        self.process, self.url, self.port, self.metrics_url, self.key = (
            process,
            url,
            port,
            metrics_url,
            key,
        )

    def peak_growth_mb(self, send) -> tuple[httpx.Response, float]:
        """Send a request; return its response and the growth of peak RSS it caused."""
        status = Path(f"/proc/{self.process.pid}/status")
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        before = _kib(status.read_text(), "VmHWM")
        response = send()
        return response, (_kib(status.read_text(), "VmHWM") - before) / 1024


def _kib(status: str, field: str) -> int:
    line = next(line for line in status.splitlines() if line.startswith(field))
    return int(line.split()[1])


@pytest.fixture(scope="module")
async def gateway(redis_url, tmp_path_factory) -> Gateway:
    state = tmp_path_factory.mktemp("abuse-gateway")
    port, metrics_port = free_port(), free_port()
    flags = {
        "host": "127.0.0.1",
        "port": port,
        "metrics-port": metrics_port,
        "redis-url": redis_url,
        "tokenizer-address": f"127.0.0.1:{free_port()}",
        "router-address": f"127.0.0.1:{free_port()}",
        "usage-spool-dir": state / "spool",
        "max-body-bytes": MAX_BODY,
        "header-timeout-seconds": 1,
        "body-timeout-seconds": 1,
        "max-connections": 8,
    }
    process = ManagedProcess("gateway", serve_argv("gateway", flags), state / "gateway.log")
    process.start()
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(process, f"{url}/healthz", 60)
        _, key = await new_tenant_key(redis_url, "abuse")
        yield Gateway(process, url, port, f"http://127.0.0.1:{metrics_port}/metrics", key)
    finally:
        process.stop(10)


def empty_lists(size: int) -> bytes:
    head, tail = b'{"model":"x","prompt":[', b"]}"
    return head + b",".join([b"[]"] * ((size - len(head) - len(tail)) // 3)) + tail


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_the_pre_auth_attack_body_is_401_and_costs_under_50_mb(gateway):
    body = b'{"model":"x","prompt":[' + b",".join([b"[]"] * 300_000) + b"]}"
    response, growth = gateway.peak_growth_mb(
        lambda: httpx.post(f"{gateway.url}/v1/completions", content=body, headers=JSON)
    )
    assert error_of(response, 401)["code"] == "invalid_api_key"
    assert growth < 50


@pytest.mark.parametrize("authorized", [False, True])
@pytest.mark.parametrize("item", [b"[]", b"{}", b"1"])
def test_a_4_mib_body_of_small_items_costs_at_most_10x_its_size(gateway, authorized, item):
    head, tail = b'{"model":"x","prompt":[', b"]}"
    body = head + b",".join([item] * ((MAX_BODY - len(head) - len(tail)) // (len(item) + 1)))
    body += tail
    headers = {**JSON, **({"authorization": f"Bearer {gateway.key}"} if authorized else {})}
    response, growth = gateway.peak_growth_mb(
        lambda: httpx.post(f"{gateway.url}/v1/completions", content=body, headers=headers)
    )
    error_of(response, 400 if authorized else 401)
    assert growth <= 10 * len(body) / MiB


def test_a_slow_body_is_408(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + gateway.key.encode() + b"\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"request_timeout"' in reply


def test_slow_headers_are_408_and_the_connection_closed(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"request_timeout"' in reply


def test_oversized_headers_are_431_and_not_kept(gateway):
    def send():
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            try:
                for _ in range(2000):  # 16 MB of headers, if nobody stops them
                    sock.sendall(b"X-Pad: " + b"a" * 8000 + b"\r\n")
            except OSError:
                pass  # closed by the server, as it should be
            return _read_all(sock)

    reply, growth = gateway.peak_growth_mb(send)
    assert reply == b"" or reply.startswith(b"HTTP/1.1 431"), reply
    assert growth < 5


def test_connections_past_the_cap_get_503_at_once(gateway):
    held = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(8)]
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as extra:
            reply = _read_all(extra)
    finally:
        for sock in held:
            sock.close()
    assert reply.startswith(b"HTTP/1.1 503"), reply
    assert b'"service_unavailable"' in reply


def test_readyz_tells_anyone_only_a_status(gateway):
    response = httpx.get(f"{gateway.url}/readyz")
    # Tokenizer and router are unreachable here: not ready, and nothing said about why.
    assert response.status_code == 503
    assert response.json() == {"status": "not ready"}


def test_metrics_are_on_the_metrics_port_only(gateway):
    assert httpx.get(f"{gateway.url}/metrics").status_code == 404
    assert "maas_gateway_http_responses" in httpx.get(gateway.metrics_url).text


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)
