"""Test-wide setup: a persistent JAX compilation cache and CPU-only, offline settings.

The xdist workers and the subprocesses their tests start share one cache folder: the controller process
sets it before it starts the workers, which inherit it, so a program compiled by one worker is read by the
other. JAX writes an entry in place, so a worker may read one that is still being written; JAX then warns
"Error reading persistent compilation cache entry" and compiles the program itself.

XLA's CPU backend compiles at LLVM optimisation level 0 (`--xla_backend_optimization_level=0`, unless XLA_FLAGS
already sets a level): much of the suite's time is compiling small programs that then run for milliseconds
(a 3-step micro SFT run on 8 simulated devices spends 13.8 of its 27.5 s in XLA's compiler, 9.9 s of them on
the train step). The HLO passes are unchanged, only the machine code is less optimised. Measured on 2 cores:
one micro SFT gradient compiles in 3.7-3.8 s instead of 5.8 s; test_sft, test_mtp_loss and test_opd together
take 235 s instead of 358 s (30 passed both ways).
"""

import os
from pathlib import Path

_ROOT = Path(os.environ.get("HAT_JAX_TEST_CACHE", Path(__file__).resolve().parents[1] / ".cache" / "jax-tests"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_ROOT))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


import pytest  # noqa: E402  (after the environment set-up above)


@pytest.fixture(scope="session")
def world():
    """The default simulated catalog, `World.generate(seed=0)` (read-only: tests must not mutate it)."""
    from hat_jax.sim.catalog import World

    return World.generate(seed=0)


@pytest.fixture(scope="session")
def harness():
    """The shipped production harness (`production_harness()`, cached and shared: read-only)."""
    from hat_jax.sim.world_harness import production_harness

    return production_harness()
