"""Starting and stopping local server processes in the deploy tests."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port nothing listens on right now (loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float, log: Path | None = None) -> None:
    """Waits until something accepts connections on `port`; fails if `proc` exits first."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log else ""
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}\n{tail}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on {port} after {timeout_s} s")


def stop_process(proc: subprocess.Popen) -> None:
    """Terminates `proc` (then kills it after 10 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
