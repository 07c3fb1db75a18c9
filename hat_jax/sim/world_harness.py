"""The world's side of a harness: what a harness may bind to here, and the shipped production harness.

`WORLD_BINDINGS` is derived from the world tools as `hat_jax.sim.tools` declares them (each tool's required
and optional canonical arguments from its `@world_tool` declaration) and from the world skills
(`hat_jax.sim.types.SKILL_KEYS`); `hat_jax.harness.loader.load_harness` checks every tool binding and skill
key of a harness against it. `load_world_harness` loads a harness folder for this world;
`production_harness` is the shipped original harness (`hat_jax/harnesses/production`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from hat_jax.harness.loader import WorldBindings, load_harness
from hat_jax.harness.state import HarnessState
from hat_jax.sim.tools import WORLD_FUNCTIONS
from hat_jax.sim.types import SKILL_KEYS

PRODUCTION_DIR = Path(__file__).resolve().parents[1] / "harnesses" / "production"


def _tool_args() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    out = {}
    for impl, fn in WORLD_FUNCTIONS.items():
        required = tuple(fn.input_schema["required"])
        out[impl] = (required, tuple(a for a in fn.input_schema["properties"] if a not in required))
    return out


WORLD_BINDINGS = WorldBindings(tool_args=_tool_args(), skill_keys=SKILL_KEYS)


def load_world_harness(path: str | Path) -> HarnessState:
    """`load_harness(path, WORLD_BINDINGS)`: a harness folder (or its `harness.yaml`) checked against this world.

    Raises:
      HarnessError: see `load_harness` (file, field path and what was expected).
    """
    return load_harness(path, WORLD_BINDINGS)


@functools.lru_cache(maxsize=1)
def production_harness() -> HarnessState:
    """The shipped production harness (`PRODUCTION_DIR`), loaded once and cached.

    The returned object is shared: treat its mappings as read-only (use `HarnessState.replace` and
    copies to derive variants).
    """
    return load_world_harness(PRODUCTION_DIR)
