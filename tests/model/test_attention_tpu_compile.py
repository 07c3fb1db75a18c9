"""The splash path compiles for a TPU topology ahead of time (libtpu's compiler on a CPU host).

Skips unless libtpu is installed (e.g. run with the AOT venv: `/work/venv-aot/bin/python -m pytest ...`).
Compiles forward + gradient of `attention(..., impl="splash")` for one v5p chip of `v5p:2x2x1` with micro
shapes; `compiled_memory` is also the helper of the real-size memory comparison (run this file as a script).
"""

import importlib.util
import os
import sys

import pytest

if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed (needed to compile for a TPU topology)", allow_module_level=True)

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hat_jax.model.attention import attention


def compiled_memory(impl: str, b: int, t: int, h: int, kv: int, d: int, dtype=jnp.bfloat16, grad: bool = True,
                    topology: str = "v5p:2x2x1"):
    """Compiles attention (and its gradient) for one chip of `topology`; returns (compiled, memory_analysis).

    Inputs are ShapeDtypeStructs on a 1-device mesh: q [B, T, H, D], k/v [B, T, KV, D] in dtype, packed
    segment ids [B, T] int32.
    """
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no lock file (as hat_jax.aot.topology)
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    mesh = Mesh(np.array(devices[:1]), ("x",))
    rep = NamedSharding(mesh, P())
    arg = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=rep)

    def f(q, k, v, seg):
        out = attention(q, k, v, seg, seg, scale=d ** -0.5, impl=impl)
        return jnp.sum(out.astype(jnp.float32))

    fn = jax.value_and_grad(f, argnums=(0, 1, 2)) if grad else f
    with jax.sharding.set_mesh(mesh):
        compiled = jax.jit(fn).lower(arg((b, t, h, d), dtype), arg((b, t, kv, d), dtype), arg((b, t, kv, d), dtype),
                                     arg((b, t), jnp.int32)).compile()
    return compiled, compiled.memory_analysis()


def test_splash_compiles_for_v5p():
    compiled, mem = compiled_memory("splash", 1, 1024, 4, 2, 128)
    text = compiled.as_text()
    assert "tpu_custom_call" in text or "custom-call" in text
    assert mem.temp_size_in_bytes < 64 * 2**20


if __name__ == "__main__":
    # real preset layer: B=1, T=16384, 16 q heads over 2 KV heads, D=256, bf16; forward + gradient on one chip
    # usage: python tests/model/test_attention_tpu_compile.py [T] [impls, e.g. splash,xla] [fwd]
    b, t, h, kv, d = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 16384, 16, 2, 256
    grad = not (len(sys.argv) > 3 and sys.argv[3] == "fwd")
    for impl in (sys.argv[2] if len(sys.argv) > 2 else "splash,xla").split(","):
        _, mem = compiled_memory(impl, b, t, h, kv, d, grad=grad)
        print(f"{impl}: B={b} T={t} H={h} KV={kv} D={d} bf16 {'fwd+grad' if grad else 'fwd'} on one v5p chip: "
              f"temp {mem.temp_size_in_bytes / 2**30:.3f} GiB, args {mem.argument_size_in_bytes / 2**30:.3f} GiB, "
              f"out {mem.output_size_in_bytes / 2**30:.3f} GiB", flush=True)
