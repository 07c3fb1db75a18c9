"""RMS norms of qwen3_5_moe (transformers `Qwen3_5MoeRMSNorm` and `Qwen3_5MoeRMSNormGated`).

Two variants live side by side in this architecture and must not be confused:
- `rms_norm`: zero-centred, `y = x̂ * (1 + w)` with `w` initialised to 0 (Gemma style). Used for the
  input/post-attention/final norms, the attention q/k norms and the MTP norms.
- `gated_rms_norm`: the plain `y = w * x̂ * silu(z)` (w initialised to 1) inside Gated DeltaNet.
Both normalise in float32 and cast back to the input dtype, as transformers does.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from hat_jax.model.sharding import param_with_axes


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Zero-centred RMSNorm over the last axis.

    Args:
        x: [..., D] any float dtype.
        weight: [D] (the stored `w`; the scale applied is `1 + w`).
        eps: added to the mean square.
    Returns:
        [..., D] in x.dtype: `x * rsqrt(mean(x^2) + eps) * (1 + w)`, computed in float32.
    """
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Gated RMSNorm of Gated DeltaNet: `w * rmsnorm(x) * silu(gate)`, over the last axis.

    Args:
        x: [..., D]; gate: [..., D]; weight: [D] (plain scale, initialised to 1).
    Returns:
        [..., D] in x.dtype. As in transformers, the normalised x is cast back to x.dtype before the
        weight multiply and the gate is applied in float32.
    """
    x32 = x.astype(jnp.float32)
    y = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    y = weight * y
    return (y.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm with a learned `weight` [D] (logical axis 'norm')."""

    eps: float
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        w = param_with_axes(self, "weight", nn.initializers.zeros, (x.shape[-1],), self.param_dtype, ("norm",))
        return rms_norm(x, w, self.eps)


class GatedRMSNorm(nn.Module):
    """Gated RMSNorm with a plain learned `weight` [D] initialised to 1 (Gated DeltaNet `norm`)."""

    eps: float
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, gate):
        w = param_with_axes(self, "weight", nn.initializers.ones, (x.shape[-1],), self.param_dtype, ("norm",))
        return gated_rms_norm(x, gate, w.astype(x.dtype), self.eps)
