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


def free_window(size: int) -> int:
    """The first of `size` consecutive ports below the ephemeral range that nothing holds
    now: fixed ones may be another test's stack's (each picks at random there), or still
    in TIME_WAIT from one, which fails a bind as well."""
    for first in range(ports._ephemeral_low() - size, ports.LOWEST, -size):
        if all(ports._bindable("127.0.0.1", port) for port in range(first, first + size)):
            return first
    raise AssertionError("no free window of ports below the ephemeral range")


def test_ports_in_use_are_never_handed_out(monkeypatch):
    first = free_window(4)
    # A window of 4 ports: the picks range over [LOWEST, the ephemeral range's low).
    monkeypatch.setattr(ports, "LOWEST", first)
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: first + 4)
    # Ports this process handed out before (another test's) must not fill the window.
    monkeypatch.setattr(ports, "_handed_out", set())
    held = []
    try:
        for port in (first, first + 1):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        picked = {ports.free_port() for _ in range(2)}
        assert picked == {first + 2, first + 3}
    finally:
        for sock in held:
            sock.close()
