"""Random inputs for the expert-FFN dispatch tests, and the gradients the tests compare across dispatches."""

import jax
import jax.numpy as jnp
import numpy as np


def expert_inputs(r: np.random.RandomState, n: int, e: int, k: int, h: int, i: int, scale: float = 1.0):
    """(x [n, h], expert_ids [n, k] distinct per token, gate_up [e, h, 2i], down [e, i, h]) drawn from `r`."""
    x = jnp.asarray(r.randn(n, h), jnp.float32)
    ids = jnp.asarray(np.stack([r.choice(e, k, replace=False) for _ in range(n)]), jnp.int32)
    gate_up = jnp.asarray(r.randn(e, h, 2 * i) * scale, jnp.float32)
    down = jnp.asarray(r.randn(e, i, h) * scale, jnp.float32)
    return x, ids, gate_up, down


def expert_grads(ffn, x, ids, gate_up, down):
    """Gradients of sum(sin(ffn(x, ids, gate_up, down))) with respect to (x, gate_up, down)."""
    return jax.grad(lambda a, g, d: jnp.sum(jnp.sin(ffn(a, ids, g, d))), argnums=(0, 1, 2))(x, gate_up, down)
