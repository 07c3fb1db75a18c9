"""The world's side of a harness: what a harness may bind to here, and the shipped production harness.

`WORLD_BINDINGS` is derived from the world tools as `hat_jax.sim.tools` declares them (each tool's required
and optional canonical arguments from its `@world_tool` declaration) and from the world skills
(`hat_jax.sim.types.SKILL_KEYS`); `hat_jax.harness.loader.load_harness` checks every tool binding and skill
key of a harness against it. `load_world_harness` loads a harness folder for this world; `world_harness` loads
a shipped harness by name (`hat_jax/harnesses/<name>`) or a folder by path, once per process;
`production_harness` is the shipped original harness (`hat_jax/harnesses/production`).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from hat_jax.harness.loader import WorldBindings, load_harness
from hat_jax.harness.state import HarnessState
from hat_jax.sim.tools import WORLD_FUNCTIONS
from hat_jax.sim.types import SKILL_KEYS

HARNESSES_DIR = Path(__file__).resolve().parents[1] / "harnesses"
PRODUCTION_DIR = HARNESSES_DIR / "production"


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


def shipped_harnesses() -> tuple[str, ...]:
    """Names of the harnesses shipped in `HARNESSES_DIR` (folders holding a `harness.yaml`), sorted."""
    return tuple(sorted(p.parent.name for p in HARNESSES_DIR.glob("*/harness.yaml")))


def harness_dir(harness: str) -> Path:
    """The folder of `harness`: a shipped harness's name (`HARNESSES_DIR / name`) or a harness folder's path.

    Raises:
      ValueError: neither a shipped name nor a folder (or `harness.yaml`) that exists; the message lists the
        shipped names.
    """
    if (HARNESSES_DIR / harness / "harness.yaml").is_file():
        return HARNESSES_DIR / harness
    path = Path(harness).expanduser()
    if path.is_dir() or path.is_file():
        return path.parent if path.is_file() else path
    raise ValueError(f"harness {harness!r}: expected a shipped harness ({', '.join(shipped_harnesses())}) or the path "
                     f"of a harness folder")


@functools.lru_cache(maxsize=8)
def world_harness(harness: str = "production") -> HarnessState:
    """The harness `harness` (a shipped name or a folder path, see `harness_dir`), loaded once per process.

    The returned object is shared: treat its mappings as read-only (use `HarnessState.replace` and
    copies to derive variants).

    Raises:
      ValueError: no such harness. HarnessError: the harness fails validation (file, field and what was expected).
    """
    return load_world_harness(harness_dir(harness))


@functools.lru_cache(maxsize=8)
def harness_content_digest(harness: str) -> str:
    """16 hex digits of the SHA-256 of the harness folder's `harness.yaml` and `skills/*/SKILL.md` files (relative
    paths and bytes, in sorted order), so caches keyed by it follow edits to the files.

    Raises:
      ValueError: no such harness (`harness_dir`).
    """
    folder = harness_dir(harness)
    sha = hashlib.sha256()
    for path in sorted([folder / "harness.yaml", *folder.glob("skills/*/SKILL.md")]):
        sha.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


def production_harness() -> HarnessState:
    """The shipped production harness (`PRODUCTION_DIR`), loaded once and cached: `world_harness("production")`."""
    return world_harness("production")
