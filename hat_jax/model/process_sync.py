"""Programs whose first run starts in every process at once (multi-process CPU runs, gloo collectives).

XLA's CPU backend creates a gloo context for each set of devices the first time a collective over that set
runs, and gives the other processes 30 s (fixed in XLA) to join it; after that a collective waits 30 minutes.
Processes compile each program independently, so on a loaded host one process can start a new program more
than 30 s after another and the run fails with "Gloo context initialization failed: ... GetKeyValue() timed
out". `start_together` compiles first (`fn.lower(...).compile()`, which fills jit's own cache), then waits at a
barrier of the JAX distributed runtime (no collective, `orbax.checkpoint.multihost.get_barrier_sync_fn`), then
runs. TPU and GPU collectives have no such deadline, so elsewhere it is a plain call.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable

import jax

BARRIER_TIMEOUT_S = 1800  # longer than any compile; a process that died is reported by JAX's heartbeat first
_BARRIERS = itertools.count()  # one sequence for every wrapped function: barrier names are never reused


def _signature(args: tuple, kwargs: dict, flat: tuple | None = None) -> tuple:
    """What decides a compile, identical in every process of an SPMD run: the tree structure, each array's
    (shape, dtype, sharding), and the other leaves' values when hashable and not numbers (numbers by type, since a
    row offset may differ by process). `flat`: `jax.tree.flatten((args, kwargs))` when the caller has it."""
    leaves, tree = flat or jax.tree.flatten((args, kwargs))

    def key(x):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return (tuple(x.shape), str(x.dtype), getattr(x, "sharding", None))
        if isinstance(x, (bool, int, float, complex)):
            return type(x)
        try:
            hash(x)
        except TypeError:
            return type(x)
        return x

    return tree, tuple(map(key, leaves))


def start_together(fn: Callable, name: str) -> Callable:
    """`fn` (a `jax.jit` function) whose first run for each argument signature (`_signature`) begins in every
    process together: with several processes on the CPU backend it is compiled, then every process waits at the
    barrier "hat_jax/{name}/{n}" (n counts the barriers of this process so far), then it runs. One process or another backend: a
    plain call. A call made while tracing (tracer arguments) is a plain call too.

    Args:
        fn: has `.lower(*args, **kwargs).compile()` (a jitted function).
        name: the barrier's name; every process must wrap the same functions with the same names and call them in
            the same order (SPMD), as their collectives require anyway.
    Returns:
        a callable with fn's signature and results; `.lower` is fn's.
    Raises:
        whatever the barrier raises when a process does not arrive within `BARRIER_TIMEOUT_S` (JAX's
        DEADLINE_EXCEEDED naming the barrier).
    """
    seen: set = set()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any):
        if jax.process_count() > 1 and jax.default_backend() == "cpu":
            flat = jax.tree.flatten((args, kwargs))
            if not any(isinstance(x, jax.core.Tracer) for x in flat[0]):
                sig = _signature(args, kwargs, flat)
                if sig not in seen:
                    from orbax.checkpoint import multihost

                    fn.lower(*args, **kwargs).compile()
                    multihost.get_barrier_sync_fn()(key=f"hat_jax/{name}/{next(_BARRIERS)}",
                                                     timeout_ms=BARRIER_TIMEOUT_S * 1000)
                    seen.add(sig)
        return fn(*args, **kwargs)

    run.lower = fn.lower
    return run
