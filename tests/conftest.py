"""Test-wide setup: a persistent JAX compilation cache (shared by subprocess tests) and CPU threading."""

import os
from pathlib import Path

_CACHE = Path(os.environ.get("HAT_JAX_TEST_CACHE", Path(__file__).resolve().parents[1] / ".cache" / "jax"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
