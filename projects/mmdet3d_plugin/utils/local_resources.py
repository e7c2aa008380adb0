"""What this machine offers a run: its usable cores and a free TCP port (``tools/demo.py``, the test suite)."""
import os
import socket


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now (the processes' rendezvous)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]
