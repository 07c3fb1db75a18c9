"""Bias-free linear projection with logical axis names (all Linear layers of qwen3_5_moe have no bias)."""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from hat_jax.model.sharding import param_with_axes


class Linear(nn.Module):
    """`y = x @ kernel`, kernel [in, out] (the transpose of the HF `[out, in]` weight).

    Inputs and kernel are cast to `dtype` (the compute dtype); the kernel is stored in `param_dtype`.
    """

    features: int
    axes: Sequence[str | None]
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    init_std: float = 0.02

    @nn.compact
    def __call__(self, x):
        kernel = param_with_axes(self, "kernel", nn.initializers.normal(self.init_std),
                                 (x.shape[-1], self.features), self.param_dtype, self.axes)
        # A 2-D matmul: on XLA:CPU the weight gradient of a [B, T, in] dot is ~2x slower than of [B*T, in].
        y = jnp.dot(x.reshape(-1, x.shape[-1]).astype(self.dtype), kernel.astype(self.dtype))
        return y.reshape(*x.shape[:-1], self.features)
