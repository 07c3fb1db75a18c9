"""Test helper: a test file run as a script in a subprocess with N simulated CPU devices
(`--xla_force_host_platform_device_count` only acts before jax starts its backend, so a multi-device check
cannot run in the pytest process itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping


def device_env(base: Mapping[str, str], devices: int) -> dict[str, str]:
    """`base` with XLA_FLAGS asking for `devices` host devices (any earlier count dropped) and JAX_PLATFORMS=cpu."""
    flags = [f for f in base.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    return {**base, "XLA_FLAGS": " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]),
            "JAX_PLATFORMS": "cpu"}


def run_device_worker(script: str, out: str, *, devices: int = 8, timeout: float = 900, what: str = "worker") -> None:
    """`python script out` with `devices` CPU devices, the script's folder and tests/ on PYTHONPATH; the worker
    writes its report to `out`. Raises AssertionError with the worker's output tail when it exits non-zero (`what` names it)."""
    env = device_env(os.environ, devices)
    folders = [os.path.dirname(os.path.abspath(script)), os.path.dirname(os.path.abspath(__file__))]
    env["PYTHONPATH"] = os.pathsep.join(folders + [env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.abspath(script), out], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{what} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
