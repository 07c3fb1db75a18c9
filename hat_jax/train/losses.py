"""Token-level loss math shared by the SFT, OPD and RL stages (pure jnp functions, jit-able, float32).

Conventions (shared by every stage): sequences are [B, T] right-padded; per-token arrays are aligned
with `input_ids`, entry t refers to token t, which the logits at position t-1 predict; entry 0 is 0 and
every mask is 0 at t = 0.

What is here, and which variant each function implements (GRPO objective: Shao et al. 2024, DeepSeekMath,
arXiv 2402.03300, eq. 3; the reference code named per item):
- log pi(token_t | tokens_<t) itself (`token_logprobs`, `token_logprobs_chunked`) is the rollout layer's
  (`hat_jax.rollout.logprobs`), shared with evaluation; the losses below take it from there.
- `masked_token_ce_sum`: (sum of masked token NLL, token count); the trainer divides the sum over all
  micro-batches by the total count, which is token-mean over the whole accumulated batch. With the
  `segment_ids` of packed rows, a target is counted only inside its document (`same_document_targets`).
  `..._chunked` computes it over vocabulary chunks, `..._counted_rows` only on the blocks of positions that
  hold a loss token (`counted_rows_nll_sum`, shared with the MTP loss).
- `k3_kl`: Schulman's k3 estimator of KL(pi_theta || pi_ref) per token (DeepSeekMath GRPO, Tunix
  `low_var_kl`), unclamped.
- `aggregate`: the loss aggregation modes of verl/TRL/Tunix: "token-mean" (DAPO, arXiv 2503.14476; verl default),
  "seq-mean-token-mean" (original GRPO, Tunix default), "seq-mean-token-sum-norm" (Dr.GRPO, Liu et al.
  2025, arXiv 2503.20783: a constant normaliser B * L_max).
- `clipped_policy_loss`: the PPO/GRPO clipped importance-ratio surrogate (DeepSeekMath eq. 3) with
  separate eps_low / eps_high (DAPO clip-higher, Yu et al. 2025, arXiv 2503.14476) and an optional
  in-loss k3 KL to a frozen reference with coefficient beta. No dual-clip, no TIS.

Advantages (GRPO, GDPO, Dr.GRPO) are in `hat_jax.train.advantages`, the OPD reverse-KL losses in
`hat_jax.train.kl`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hat_jax.rollout.logprobs import (next_token_values, predicting_rows, running_logsumexp, token_logprobs,
                                     token_logprobs_chunked, vocab_chunk_logits)

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_aggregation(mode: str) -> str:
    """Return `mode` if it is one of `AGGREGATIONS`, else raise ValueError listing them."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")
    return mode


# --------------------------------------------------------------------------------------------------
# SFT cross-entropy


def same_document_targets(segment_ids: jax.Array) -> jax.Array:
    """Where a next-token target stays inside one document of a packed row.

    Args:
        segment_ids: [B, T] int (0 = padding, 1..n = the row's documents; `hat_jax.data.packing`).
    Returns:
        [B, T] bool: entry t is True when t > 0 and tokens t - 1 and t belong to the same document (so
        the target at t, predicted from t - 1, never crosses from one document into the next, and padding
        is never a target).
    """
    same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
    return jnp.pad(same, ((0, 0), (1, 0)))


def token_entropy_chunked(hidden: jax.Array, kernel: jax.Array, chunk: int, temperature: float, compute_dtype) -> jax.Array:
    """[B, T] entropy of the next-token distribution of `hidden @ kernel / temperature` (entry t: of position
    t-1's logits, entry 0 = 0), over vocabulary chunks: H = lse - sum_v e^(z_v - m) z_v / S. No gradient flows
    (a metric); never builds [B, T, V].

    Args:
        hidden: [B, T, H]; kernel: [H, V] (the lm_head); chunk: vocabulary chunk width (clipped to V);
        temperature: the sampling temperature; compute_dtype: the matmul dtype.
    Returns:
        [B, T] float32.
    """
    b, t, _ = hidden.shape
    vocab = kernel.shape[1]
    size = min(int(chunk), vocab)
    x = jax.lax.stop_gradient(predicting_rows(hidden))
    k = jax.lax.stop_gradient(kernel)

    def body(carry, i):
        m, s, w = carry
        z, _, fresh = vocab_chunk_logits(x, k, i, size, temperature, compute_dtype)
        m, s, e, scale = running_logsumexp(m, s, z, fresh)
        return (m, s, w * scale + jnp.sum(e * jnp.where(fresh[None, :], z, 0.0), axis=-1)), None

    rows = x.shape[0]
    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32), jnp.zeros((rows,), jnp.float32))
    (m, s, w), _ = jax.lax.scan(body, init, jnp.arange(-(-vocab // size)))
    return next_token_values(m + jnp.log(s) - w / s, b, t)


def counted_targets(loss_mask: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """[B, T] float32 weights of the targets a token loss counts: `loss_mask`, restricted to
    `same_document_targets(segment_ids)` for packed rows (no target crosses documents)."""
    m = loss_mask.astype(jnp.float32)
    return m if segment_ids is None else jnp.where(same_document_targets(segment_ids), m, 0.0)


def masked_nll_sum(logprobs: jax.Array, loss_mask: jax.Array,
                   segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(-sum of masked logprobs, number of masked tokens), both float32 scalars.

    Args:
        logprobs: [B, T] from `token_logprobs*`; loss_mask: [B, T] 0/1 (0 at t = 0).
        segment_ids: [B, T] of a packed row, or None; given, the mask is also restricted to
            `same_document_targets(segment_ids)` (no target crosses documents).
    """
    m = counted_targets(loss_mask, segment_ids)
    return -jnp.sum(jnp.where(m != 0, logprobs * m, 0.0)), jnp.sum(m)


def masked_token_ce_sum(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array,
                        segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Summed token cross-entropy over `loss_mask` and the token count (SFT).

    Token-mean across micro-batches: sum the first value over micro-batches and divide by the sum of
    the second (never average per-micro-batch means; DAPO's token-mean, arXiv 2503.14476, over the global batch as
    verl's default and TRL's `dapo` loss compute it).

    Args:
        logits: [B, T, V]; input_ids: [B, T] int32; loss_mask: [B, T] 0/1 (assistant tokens).
        segment_ids: [B, T] int32 of packed rows (0 = padding), or None: a document's first token is
            then never a target (`masked_nll_sum`).
    Returns:
        (sum_nll float32 scalar, n_tokens float32 scalar).
    """
    return masked_nll_sum(token_logprobs(logits, input_ids), loss_mask, segment_ids)


def masked_token_ce_sum_chunked(hidden: jax.Array, lm_head_kernel: jax.Array, input_ids: jax.Array,
                                loss_mask: jax.Array, chunk: int = 8192, compute_dtype=jnp.float32,
                                segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """`masked_token_ce_sum` from hidden states and the lm_head kernel, vocabulary-chunked (segment_ids as there)."""
    lp = token_logprobs_chunked(hidden, lm_head_kernel, input_ids, chunk, compute_dtype=compute_dtype)
    return masked_nll_sum(lp, loss_mask, segment_ids)


COUNTED_BLOCK_ROWS = 256  # positions per block of `counted_rows_nll_sum` (the CPU stages' default without vocab_chunk)


def counted_rows_nll_sum(rows: jax.Array, lm_head_kernel: jax.Array, targets: jax.Array, mask: jax.Array,
                         block_rows: int = COUNTED_BLOCK_ROWS, compute_dtype=jnp.float32) -> jax.Array:
    """sum_i mask_i * -log softmax(rows_i @ lm_head_kernel)[targets_i], with the lm_head run only on the blocks of
    `block_rows` consecutive rows that hold a counted row: a `jax.lax.scan` over the blocks whose body (under
    `jax.lax.cond`, rematerialised) computes a block's [block_rows, V] logits only when its mask is not all 0.
    SFT rows hold few loss tokens (a ~930-token system prompt and the tool results before each assistant turn:
    ~470 of 8,192 positions per tiny step), so most blocks are skipped, forward and backward.

    Args:
        rows: [N, H] hidden states (one per predicting position). lm_head_kernel: [H, V]. targets: [N] int32.
        mask: [N] float weights (0 = not counted). block_rows: rows per block (> 0; clipped to N).
        compute_dtype: the matmul dtype (logits float32).
    Returns:
        float32 scalar, the weighted NLL sum (equal to the full-logits sum up to float rounding).
    """
    n, h = rows.shape
    size = min(block_rows, n)
    blocks = -(-n // size)
    fill = blocks * size - n
    x = jnp.pad(rows, ((0, fill), (0, 0))).reshape(blocks, size, h)
    y = jnp.pad(targets.astype(jnp.int32), (0, fill)).reshape(blocks, size)
    m = jnp.pad(mask.astype(jnp.float32), (0, fill)).reshape(blocks, size)
    k = lm_head_kernel.astype(compute_dtype)

    def block_nll(xb, yb, mb):
        z = jnp.dot(xb.astype(compute_dtype), k, preferred_element_type=jnp.float32)
        nll = jax.nn.logsumexp(z, axis=-1) - jnp.take_along_axis(z, yb[:, None], axis=-1)[:, 0]
        return jnp.sum(jnp.where(mb != 0, nll * mb, 0.0))

    def body(total, xs):
        xb, yb, mb = xs
        return total + jax.lax.cond(jnp.any(mb != 0), block_nll, lambda *_: jnp.zeros((), jnp.float32), xb, yb,
                                    mb), None

    total, _ = jax.lax.scan(jax.checkpoint(body, prevent_cse=False), jnp.zeros((), jnp.float32), (x, y, m))
    return total


def masked_token_ce_sum_counted_rows(hidden: jax.Array, lm_head_kernel: jax.Array, input_ids: jax.Array,
                                     loss_mask: jax.Array, segment_ids: jax.Array | None = None,
                                     block_rows: int = COUNTED_BLOCK_ROWS,
                                     compute_dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
    """`masked_token_ce_sum` from hidden states and the lm_head kernel, the logits computed only on the blocks of
    positions that predict a loss token (`counted_rows_nll_sum`; position t predicts token t + 1).

    Args:
        hidden: [B, T, H] final hidden states. lm_head_kernel: [H, V]. input_ids, loss_mask, segment_ids: as
        `masked_token_ce_sum`. block_rows: positions per block. compute_dtype: the matmul dtype.
    Returns:
        (sum_nll float32 scalar, n_tokens float32 scalar), equal to `masked_token_ce_sum` up to float rounding.
    """
    b, t, h = hidden.shape
    m = counted_targets(loss_mask, segment_ids)
    mask = jnp.pad(m[:, 1:], ((0, 0), (0, 1))).reshape(-1)          # position t counts when token t + 1 does
    targets = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1))).reshape(-1)
    total = counted_rows_nll_sum(hidden.reshape(b * t, h), lm_head_kernel, targets, mask, block_rows, compute_dtype)
    return total, jnp.sum(m)


# --------------------------------------------------------------------------------------------------
# KL to a reference, aggregation, clipped policy loss


def k3_kl(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """Schulman's k3 per-token estimator of KL(pi_theta || pi_ref) (J. Schulman, "Approximating KL divergence",
    2020; in the loss as DeepSeekMath GRPO, arXiv 2402.03300).

    k3 = r - 1 - log r with r = pi_ref / pi_theta = exp(ref_logprobs - logprobs), on tokens sampled
    from pi_theta: unbiased for the KL, >= 0, lower variance than k1 = logprobs - ref_logprobs. Used by
    DeepSeekMath GRPO; Tunix `low_var_kl` (unclamped; verl clamps log r to +-20 and k3 to +-10).

    Computed as max(expm1(d) - d, 0) with d = log r: expm1 avoids the cancellation of exp(d) - 1 for small d, and
    the clamp removes the last rounding below 0 (exp(d) - d - 1 gives -6e-8 at d = 4e-7 in float32).

    Args:
        logprobs, ref_logprobs: [N, T] float. Returns: [N, T] float32, >= 0 (0 where both are equal, e.g. padding).
    """
    d = ref_logprobs.astype(jnp.float32) - logprobs.astype(jnp.float32)
    return jnp.maximum(jnp.expm1(d) - d, 0.0)


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str, max_len: int | None = None,
              total_tokens: jax.Array | float | None = None,
              total_sequences: jax.Array | float | None = None) -> jax.Array:
    """Reduce a per-token loss L [N, T] over mask m [N, T] to a scalar (verl `agg_loss` modes; TRL `loss_type`).

    - "token-mean":              sum_{i,t} m L / sum_{i,t} m                    (DAPO; verl default)
    - "seq-mean-token-mean":     1/N sum_i [ sum_t m L / sum_t m ]              (GRPO original; Tunix)
    - "seq-mean-token-sum-norm": 1/(N * max_len) sum_{i,t} m L                  (Dr.GRPO; TRL `dr_grpo`)

    N is the number of rows (sequences with an empty mask count and contribute 0); an empty
    denominator gives 0, never NaN. For gradient accumulation pass the whole batch's `total_tokens`
    (token-mean) or `total_sequences` (the seq modes): then the sum over micro-batches of `aggregate`
    equals `aggregate` of the whole batch.

    Args:
        per_token: [N, T] float; mask: [N, T] 0/1; mode: one of `AGGREGATIONS`;
        max_len: the constant L_max (the generation budget), required by "seq-mean-token-sum-norm"
            (not defaulted to T: T changes with padding, the normaliser must not).
    Returns:
        float32 scalar.
    """
    check_aggregation(mode)
    m = mask.astype(jnp.float32)
    x = jnp.where(m != 0, per_token.astype(jnp.float32) * m, 0.0)
    if mode == "token-mean":
        denom = jnp.sum(m) if total_tokens is None else jnp.asarray(total_tokens, jnp.float32)
        return jnp.sum(x) / jnp.maximum(denom, 1.0)
    n_seq = jnp.asarray(per_token.shape[0] if total_sequences is None else total_sequences, jnp.float32)
    n_seq = jnp.maximum(n_seq, 1.0)
    if mode == "seq-mean-token-mean":
        return jnp.sum(jnp.sum(x, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)) / n_seq
    if max_len is None:
        raise ValueError("aggregation 'seq-mean-token-sum-norm' (Dr.GRPO) needs max_len, the constant "
                         "generation budget L_max")
    return jnp.sum(x) / (n_seq * max_len)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Token mean of x over mask (0 if the mask is empty); float32 scalar."""
    return aggregate(x, mask, "token-mean")


def clipped_policy_loss(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
                        action_mask: jax.Array, *, eps_low: float = 0.2, eps_high: float = 0.2,
                        aggregation: str = "token-mean", max_len: int | None = None,
                        ref_logprobs: jax.Array | None = None, beta: float | jax.Array = 0.0,
                        total_tokens=None, total_sequences=None,
                        loss_weights: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """Clipped importance-ratio policy-gradient loss (GRPO, DeepSeekMath eq. 3; clip-higher from DAPO).

    Per token (rho = exp(logprobs - old_logprobs), A the advantage, both inputs but logprobs held out
    of the gradient):
        L_t = max( -A rho, -A clip(rho, 1 - eps_low, 1 + eps_high) ) + beta * k3_kl(logprobs, ref_logprobs)
    i.e. minus the pessimistic PPO surrogate. Where the clipped branch is taken (rho > 1 + eps_high with
    A > 0, or rho < 1 - eps_low with A < 0) the token's gradient is 0. The KL is in the loss (gradient
    through logprobs), not in the reward. The loss is `aggregate(L, action_mask, aggregation)`.

    Args:
        logprobs: [N, T] current-policy token logprobs (differentiated).
        old_logprobs: [N, T] sampler / pi_old logprobs.
        advantages: [N] (outcome advantage, broadcast over tokens) or [N, T] (per token).
        action_mask: [N, T] 0/1, 1 on model-sampled tokens.
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] (DAPO: 0.2, 0.28).
        aggregation, max_len, total_tokens, total_sequences: see `aggregate`.
        ref_logprobs: [N, T] frozen-reference logprobs; needed only when beta != 0.
        beta: KL coefficient (0 allowed).
        loss_weights: [N, T] float32 per-token weights that replace action_mask in the loss's `aggregate`
            (packed rows: `hat_jax.train.policy_packing` folds each sequence's normaliser into them; then use
            aggregation "token-mean" with total_tokens=1.0, so the loss is sum(weights x L)); the metrics
            stay over action_mask.
    Returns:
        (loss float32 scalar, metrics dict of float32 scalars: pg_loss, kl (token-mean k3; 0 without a
        reference), clip_frac_low, clip_frac_high, clip_frac (token fractions where the clipped branch
        is active), ratio_mean, ratio_max, approx_kl = token-mean of (rho - 1) - log rho, the k3
        estimate of KL(pi_old || pi_theta)).
    """
    check_aggregation(aggregation)
    if logprobs.shape != old_logprobs.shape or logprobs.shape != action_mask.shape:
        raise ValueError(f"logprobs {logprobs.shape}, old_logprobs {old_logprobs.shape} and action_mask "
                         f"{action_mask.shape} must have the same [N, T] shape")
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    if advantages.shape not in ((logprobs.shape[0], 1), logprobs.shape):
        raise ValueError(f"advantages: expected [N] or [N, T] for logprobs {logprobs.shape}, got {advantages.shape}")
    if ref_logprobs is None and not (isinstance(beta, (int, float)) and beta == 0):
        raise ValueError("clipped_policy_loss: beta != 0 needs ref_logprobs")
    lp = logprobs.astype(jnp.float32)
    adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))
    log_ratio = lp - jax.lax.stop_gradient(old_logprobs.astype(jnp.float32))
    ratio = jnp.exp(log_ratio)
    pg = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    per_token = pg
    kl = None
    if ref_logprobs is not None:
        kl = k3_kl(lp, jax.lax.stop_gradient(ref_logprobs))
        per_token = pg + beta * kl
    agg = dict(mode=aggregation, max_len=max_len, total_tokens=total_tokens, total_sequences=total_sequences)
    weights = action_mask if loss_weights is None else loss_weights
    loss = aggregate(per_token, weights, **agg)

    sg = jax.lax.stop_gradient
    r, a, on = sg(ratio), jnp.broadcast_to(adv, ratio.shape), action_mask != 0
    low = ((r < 1.0 - eps_low) & (a < 0)).astype(jnp.float32)
    high = ((r > 1.0 + eps_high) & (a > 0)).astype(jnp.float32)
    metrics = {
        "pg_loss": sg(aggregate(pg, weights, **agg)),
        "kl": jnp.float32(0.0) if kl is None else sg(masked_mean(kl, action_mask)),
        "clip_frac_low": masked_mean(low, action_mask),
        "clip_frac_high": masked_mean(high, action_mask),
        "clip_frac": masked_mean(low + high, action_mask),
        "ratio_mean": masked_mean(r, action_mask),
        "ratio_max": jnp.max(jnp.where(on, r, 0.0)),
        "approx_kl": masked_mean(r - 1.0 - sg(log_ratio), action_mask),
    }
    return loss, metrics
