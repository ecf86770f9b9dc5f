import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody holds right now; the child binds it moments later."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
