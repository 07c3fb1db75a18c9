"""Per-layer router statistics: the sums over tokens that the MoE auxiliary losses need, and those losses.

Every MoE auxiliary of a forward is a function of per-expert sums over its non-padding tokens, so a layer
can reduce its [N, E] router logits to [E]-sized sums where they are made (`Qwen3_5MoeForCausalLM` with
`router_stats=True`) and no [L, N, E] array leaves the model. Per layer, over the tokens with mask 1:
    counts_e    = number of top-k assignments to expert e (top-k of softmax(logits), no gradient)
    prob_sums_e = sum of softmax(logits)_e (float32; the load-balancing loss's gradient flows through it)
    lse_sq_sum  = sum of logsumexp(logits)^2 (the router z-loss's numerator)
    tokens      = number of tokens
From them (layers pooled, rows = L * tokens, as transformers' `load_balancing_loss_func` pools them):
    lb_loss = E * sum_e (sum_l counts_le / rows) * (sum_l prob_sums_le / rows)   (`load_balancing_loss`)
    z_loss  = sum_l lse_sq_sum_l / rows                                          (`router_z_loss`)
    cv      = std_e / mean_e of sum_l counts_le                                   (`moe/expert_load_cv`)
`hat_jax.model.moe.load_balancing_loss` / `router_z_loss` (of stacked [L, N, E] logits, the functions the
tests compare with transformers) compute through these; in-layer sums equal them up to the order of the
float32 sums (tests/model/test_router_stats.py).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class RouterStats:
    """Sums over non-padding tokens of one forward's routing, per layer (module docstring). Leading dims [*L]
    ([L] from the model, none for one layer): counts [*L, E] float32 (whole numbers, no gradient),
    prob_sums [*L, E] float32, lse_sq_sum [*L] float32, tokens [*L] float32."""

    counts: jax.Array
    prob_sums: jax.Array
    lse_sq_sum: jax.Array
    tokens: jax.Array


def router_stats(router_logits: jax.Array, top_k: int, token_mask: jax.Array | None = None) -> RouterStats:
    """The sums of the module docstring from raw router logits.

    Args:
        router_logits: [*L, N, E] (any float dtype; computed in float32). top_k: experts per token.
        token_mask: [N] (bool or 0/1; any shape with N elements, e.g. [B, T]) or None (all tokens); 0 = padding.
    Returns:
        RouterStats with leading dims [*L].
    """
    n, e = router_logits.shape[-2:]
    logits = router_logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    _, ids = jax.lax.top_k(probs, top_k)                                                    # [*L, N, k]
    w = jnp.ones((n,), jnp.float32) if token_mask is None else token_mask.astype(jnp.float32).reshape(n)
    counts = jnp.sum(jax.nn.one_hot(ids, e, dtype=jnp.float32) * w[:, None, None], axis=(-3, -2))
    prob_sums = jnp.sum(probs * w[:, None], axis=-2)
    lse_sq_sum = jnp.sum(jax.nn.logsumexp(logits, axis=-1) ** 2 * w, axis=-1)
    tokens = jnp.broadcast_to(jnp.sum(w), lse_sq_sum.shape)
    return RouterStats(jax.lax.stop_gradient(counts), prob_sums, lse_sq_sum, tokens)


def _pooled_rows(stats: RouterStats) -> jax.Array:
    """L * tokens (float32 scalar, floored at 1): the token rows of all layers pooled."""
    return jnp.maximum(jnp.sum(stats.tokens), 1.0)


def load_balancing_loss_from_stats(stats: RouterStats) -> jax.Array:
    """transformers' `load_balancing_loss_func` (padding excluded) from the sums: float32 scalar,
    E * sum_e (counts_e / rows) * (prob_sums_e / rows) with both sums pooled over layers; equals
    `hat_jax.model.moe.load_balancing_loss` of the stacked logits. stats: leading dims [L] or none."""
    rows = _pooled_rows(stats)
    counts = jnp.sum(stats.counts.reshape(-1, stats.counts.shape[-1]), axis=0)
    prob_sums = jnp.sum(stats.prob_sums.reshape(-1, stats.prob_sums.shape[-1]), axis=0)
    return counts.shape[-1] * jnp.sum((counts / rows) * (prob_sums / rows))


def router_z_loss_from_stats(stats: RouterStats) -> jax.Array:
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5) from the sums: float32 scalar, the mean over layers
    and non-padding tokens of logsumexp(logits)^2; equals `hat_jax.model.moe.router_z_loss`."""
    return jnp.sum(stats.lse_sq_sum) / _pooled_rows(stats)


def expert_load_cv(stats: RouterStats) -> jax.Array:
    """Coefficient of variation (std / mean over experts) of the top-k assignment counts pooled over layers:
    float32 scalar, 0 = balanced; no gradient."""
    counts = jnp.sum(stats.counts.reshape(-1, stats.counts.shape[-1]), axis=0)
    return jax.lax.stop_gradient(jnp.std(counts) / jnp.maximum(jnp.mean(counts), 1e-9))
