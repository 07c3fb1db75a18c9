"""Test helpers for killed-run tests: SIGKILL a subprocess as soon as a checkpoint directory appears.

The watcher is its own process, so a test may run the uninterrupted reference in its own process meanwhile:
a watcher thread there could wait for the GIL (tracing and compiling hold it for seconds) and let the
watched run finish the next step before the kill.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_WATCH = """
import os, signal, sys, time
pid, path, deadline = int(sys.argv[1]), sys.argv[2], time.time() + float(sys.argv[3])
while not os.path.isdir(path) and time.time() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(0)
    time.sleep(0.005)
try:
    os.kill(pid, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def sigkill_when_dir_appears(proc: subprocess.Popen, path: Path, timeout_s: float = 300.0) -> subprocess.Popen:
    """Start a watcher process that SIGKILLs `proc` once `path` is a directory (Orbax renames a finished step
    directory into place), or after `timeout_s` seconds, or exits when `proc` is gone. Returns the watcher;
    `wait()` on it before reading the result."""
    return subprocess.Popen([sys.executable, "-c", _WATCH, str(proc.pid), str(path), str(timeout_s)])
