"""`start_together`: a new program's first collective does not hit gloo's 30 s context deadline when one process
reaches it 35 s after the other (2 processes x 2 CPU devices on loopback); in one process it is a plain call."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from device_worker import device_env
from hat_jax.model.process_sync import _signature, start_together

WORKER = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from hat_jax.model.process_sync import start_together
    from hat_jax.train.distributed import initialize

    pid, port, late_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    initialize(f"127.0.0.1:{port}", 2, pid, timeout_s=120)
    mesh = jax.make_mesh((4,), ("d",), devices=jax.devices())  # all 4 devices: a set no collective used yet
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.full((2,), pid + 1.0, np.float32),
                                               (4,))
    total = start_together(jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(mesh, P())), "sum")
    time.sleep(late_s)  # this process reaches the new program late (a slow compile on a loaded host)
    print("SUM", float(total(x)), float(total(x)))
""")


def test_a_late_process_joins_the_first_collective(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = device_env(os.environ, 2)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(i), port, "35" if i else "0"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "SUM 6.0 6.0" in out, out + err[-2000:]


def test_one_process_is_a_plain_call_and_keeps_lower():
    f = jax.jit(lambda a, k: a * k, static_argnums=1)
    g = start_together(f, "mul")
    np.testing.assert_array_equal(g(jnp.arange(3.0), 2), [0.0, 2.0, 4.0])
    assert g.lower == f.lower
    assert jax.jit(lambda a: g(a, 3))(jnp.ones(2)).tolist() == [3.0, 3.0]  # traced inside another jit


def test_signature_keys_arrays_by_shape_dtype_sharding_and_numbers_by_type():
    a, b = jnp.zeros((2, 3)), jnp.ones((2, 3))
    assert _signature((a, 1), {"k": "x"}) == _signature((b, 7), {"k": "x"})  # values and row offsets: one compile
    assert _signature((a,), {}) != _signature((jnp.zeros((3, 2)),), {})
    assert _signature((a,), {}) != _signature((a.astype(jnp.int32),), {})
    assert _signature((a,), {"k": "x"}) != _signature((a,), {"k": "y"})  # static values count
    assert _signature(({"p": a},), {}) != _signature(({"q": a},), {})  # tree structure counts
