"""The ports a local stack hands its children (tools/local/ports.py)."""

import socket

from maas_tools.local import ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    low = ports._ephemeral_low()
    picked = [ports.free_port() for _ in range(200)]
    assert len(set(picked)) == len(picked)
    assert all(ports.LOWEST <= port < low for port in picked)
    for port in picked[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_ports_in_use_are_never_handed_out(monkeypatch):
    low = ports._ephemeral_low()
    monkeypatch.setattr(ports, "LOWEST", low - 4)  # a window of 4 ports
    # Ports this process handed out before (another test's) must not fill the window.
    monkeypatch.setattr(ports, "_handed_out", set())
    held = []
    try:
        for port in (low - 4, low - 3):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        picked = {ports.free_port() for _ in range(2)}
        assert picked == {low - 2, low - 1}
    finally:
        for sock in held:
            sock.close()
