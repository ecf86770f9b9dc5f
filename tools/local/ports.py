"""Ports for a local stack's children, picked before the children bind them.

The port the kernel gives bind(0) comes from the ephemeral range, the range
every outgoing connection takes its local port from. Between picking a port
and the child binding it (an engine loads its model first: seconds), any
connection on the machine may take that port, and the child fails to start
("Failed to bind to address"). So ports come from below the ephemeral range,
where connections never land, at random, checked free by binding them, and
this process never hands out one port twice (two children of one stack
picked in a row could otherwise get the same one).
"""

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # below: the well-known and registered ports services listen on
TRIES = 64

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; elsewhere the range is unknown


def _kernel_pick(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody holds now and no outgoing connection will take; the child binds it."""
    low = _ephemeral_low()
    for _ in range(TRIES):
        # With no room below the ephemeral range on this machine: the kernel's pick.
        port = random.randrange(LOWEST, low) if low > LOWEST else _kernel_pick(host)
        if port not in _handed_out and _bindable(host, port):
            _handed_out.add(port)
            return port
    raise OSError(f"no free port on {host} in {TRIES} tries")
