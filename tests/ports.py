"""A free local TCP port for the tests that start a server or a process group (imported by name,
as `slow_toys` is, with this directory on sys.path)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now (the OS's pick, released at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
