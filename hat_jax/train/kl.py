"""On-policy distillation losses: reverse KL from the student to a frozen teacher (the HAT report, arXiv 2608.15763
(TaoLive, 2026), "Training, three stages", stage 2: general OPD, teacher = the base before SFT).

The target is the per-token reverse KL along student samples, KL_t = KL(pi_s(.|c_t) || pi_T(.|c_t)),
c_t = (x, y_<t), y ~ pi_s (GKD with lambda = 1 and the reverse-KL end of JSD(beta); Agarwal et al. 2024,
arXiv 2306.13649). Two losses, named in `OPD_LOSSES`:

- "sampled" (`sampled_reverse_kl_loss`): Thinking Machines' on-policy distillation (K. Lu, 2025;
  tinker-cookbook `incorporate_kl_penalty`) as implemented in JAX by marin
  (`rl/opd_losses.py: sampled_token_reverse_kl_opd_loss`). Per sampled token the k1 estimate
  k_t = log pi_old(y_t) - log pi_T(y_t) becomes the advantage A_t = -kl_coef * k_t (held constant), and
  the loss is the importance-weighted policy gradient -rho_t A_t, rho_t = pi_theta(y_t) / pi_old(y_t),
  optionally PPO-clipped. Discount 0: the gradient ignores the effect of y_t on later KL terms.
  Bias: at theta = theta_old (rho = 1), E_{y_t ~ pi_old}[grad] = grad_theta KL_t at the fixed context
  c_t exactly (the score-function identity; tested by enumeration), so on-policy it is unbiased for
  sum_t E[grad KL_t(c_t)] with the contexts held fixed, and omits the term through which y_t changes
  later contexts. Off-policy (theta != theta_old, later
  minibatch steps) the advantage still uses log pi_old, not log pi_theta, and contexts come from pi_old,
  so it is biased; clipping adds bias where it is active. The k1 value itself is an unbiased but
  high-variance, possibly negative estimate of KL_t (k3 = r - 1 - log r, r = pi_T/pi_old is reported too).
- "exact" (`exact_reverse_kl`): the full-vocabulary KL_t = sum_v pi_s(v) (log pi_s(v) - log pi_T(v)),
  differentiated directly (no estimator, no IS ratio; NeMo-RL's "full"), vocabulary-chunked from hidden
  states + lm_head kernels so neither [B, T, V] exists, or from full logits. Exact per position; the
  only approximation is that contexts were sampled from pi_old (no gradient through the sampling).
  Not top-k truncated (verl #5041 found truncated reverse KL unstable).

Both use the sampler temperature in every logprob (as marin's `compute_logprobs` divides logits by
`batch.temperature`; top-p/top-k truncation would bias the ratio, TRL #6789). The teacher side
is always held out of the gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hat_jax.rollout.logprobs import (chunk_plan, next_token_values, predicting_rows, running_logsumexp, shift_pad,
                                     vocab_chunk_logits)
from hat_jax.train.losses import aggregate, check_aggregation, clipped_policy_loss, masked_mean

OPD_LOSSES = ("sampled", "exact")


def check_opd_loss(name: str) -> str:
    """Return `name` if it is one of `OPD_LOSSES`, else raise ValueError listing them."""
    if name not in OPD_LOSSES:
        raise ValueError(f"unknown OPD loss {name!r}; valid: {', '.join(OPD_LOSSES)}")
    return name


def sampled_reverse_kl_loss(logprobs: jax.Array, old_logprobs: jax.Array, teacher_logprobs: jax.Array,
                            action_mask: jax.Array, *, clip_eps: float | None = None, kl_coef: float = 1.0,
                            aggregation: str = "token-mean", max_len: int | None = None,
                            total_tokens=None, total_sequences=None,
                            loss_weights: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """Sampled-token reverse-KL OPD loss (module docstring, "sampled").

    A_t = -kl_coef * (old_logprobs_t - teacher_logprobs_t) * m_t (stop-gradient);
    L_t = -min(rho_t A_t, clip(rho_t, 1 - clip_eps, 1 + clip_eps) A_t),  rho_t = exp(logprobs_t - old_logprobs_t)
    (no clipping when clip_eps is None), aggregated with `aggregate`. Implemented as
    `clipped_policy_loss` with per-token advantages.

    Args:
        logprobs: [N, T] current student logprobs (differentiated).
        old_logprobs: [N, T] sampler (student at sampling time) logprobs.
        teacher_logprobs: [N, T] teacher logprobs of the same tokens.
        action_mask: [N, T] 0/1 on sampled tokens.
        loss_weights: [N, T] per-token weights of packed rows, as in `clipped_policy_loss`.
    Returns:
        (loss, metrics): `clipped_policy_loss` metrics plus reverse_kl_k1 / reverse_kl_k3, token means of
        the k1 and k3 estimates of KL(pi_old || pi_T) on the sampled tokens.
    """
    sg = jax.lax.stop_gradient
    m = action_mask.astype(jnp.float32)
    k1 = sg(old_logprobs.astype(jnp.float32) - teacher_logprobs.astype(jnp.float32))
    adv = jnp.where(m != 0, -kl_coef * k1 * m, 0.0)
    eps = jnp.inf if clip_eps is None else clip_eps
    loss, metrics = clipped_policy_loss(logprobs, old_logprobs, adv, action_mask, eps_low=eps, eps_high=eps,
                                        aggregation=aggregation, max_len=max_len, total_tokens=total_tokens,
                                        total_sequences=total_sequences, loss_weights=loss_weights)
    metrics["reverse_kl_k1"] = masked_mean(k1, action_mask)
    metrics["reverse_kl_k3"] = masked_mean(jnp.maximum(jnp.expm1(-k1) + k1, 0.0), action_mask)  # k3 >= 0
    return loss, metrics


def reverse_kl_per_token(student_logits: jax.Array, teacher_logits: jax.Array,
                         temperature: float | jax.Array = 1.0) -> jax.Array:
    """Exact KL(pi_s || pi_T) of the next-token distributions, aligned with `input_ids`.

    Args:
        student_logits, teacher_logits: [B, T, V] (teacher held out of the gradient).
        temperature: divides both logits.
    Returns:
        [B, T] float32: entry 0 = 0, entry t = sum_v p_s(v) (log p_s(v) - log p_T(v)) of position t-1's logits.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {student_logits.shape} and teacher logits {teacher_logits.shape} differ")
    ls = jax.nn.log_softmax(student_logits[:, :-1].astype(jnp.float32) / temperature, axis=-1)
    lt = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits[:, :-1]).astype(jnp.float32) / temperature, axis=-1)
    return shift_pad(jnp.sum(jnp.exp(ls) * (ls - lt), axis=-1))


def reverse_kl_per_token_chunked(student_hidden: jax.Array, student_kernel: jax.Array, teacher_hidden: jax.Array,
                                 teacher_kernel: jax.Array, chunk: int = 8192,
                                 temperature: float | jax.Array = 1.0, compute_dtype=jnp.float32) -> jax.Array:
    """`reverse_kl_per_token(student_hidden @ student_kernel, teacher_hidden @ teacher_kernel)`, chunked.

    One `jax.lax.scan` over vocabulary chunks (rematerialised body) keeps running logsumexps of both
    models and the running sum W = sum_v exp(z_s - m_s) (z_s - z_T), then
        KL = W / S_s - lse_s + lse_T      (= E_{p_s}[z_s - z_T] - lse_s + lse_T).
    This single pass subtracts O(|logit|) numbers: float32 error ~1e-7 * max|logit|.

    Args:
        student_hidden: [B, T, Hs]; student_kernel: [Hs, V]; teacher_hidden: [B, T, Ht]; teacher_kernel: [Ht, V].
        chunk, temperature, compute_dtype: as `token_logprobs_chunked`.
    Returns:
        [B, T] float32, as `reverse_kl_per_token`.
    """
    b, t, _ = student_hidden.shape
    if teacher_hidden.shape[:2] != (b, t) or student_kernel.shape[1] != teacher_kernel.shape[1]:
        raise ValueError(f"student hidden {student_hidden.shape} / kernel {student_kernel.shape} and teacher hidden "
                         f"{teacher_hidden.shape} / kernel {teacher_kernel.shape}: need the same [B, T] and V")
    size, n_chunks = chunk_plan(student_kernel.shape[1], chunk)
    xs = predicting_rows(student_hidden)
    xt = jax.lax.stop_gradient(predicting_rows(teacher_hidden))
    kt = jax.lax.stop_gradient(teacher_kernel)

    def body(carry, i):
        ms, ss, mt, st, w = carry
        zs, _, fresh = vocab_chunk_logits(xs, student_kernel, i, size, temperature, compute_dtype)
        zt, _, _ = vocab_chunk_logits(xt, kt, i, size, temperature, compute_dtype)
        ms, ss, es, scale = running_logsumexp(ms, ss, zs, fresh)
        mt, st, _, _ = running_logsumexp(mt, st, zt, fresh)
        diff = jnp.where(fresh[None, :], zs - zt, 0.0)
        return (ms, ss, mt, st, w * scale + jnp.sum(es * diff, axis=-1)), None

    rows = xs.shape[0]
    neg, zero = jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32)
    (ms, ss, mt, st, w), _ = jax.lax.scan(jax.checkpoint(body, prevent_cse=False), (neg, zero, neg, zero, zero),
                                          jnp.arange(n_chunks))
    kl = w / ss - (ms + jnp.log(ss)) + (mt + jnp.log(st))
    return next_token_values(kl, b, t)


def exact_reverse_kl(student, teacher, action_mask: jax.Array, *, chunk: int | None = None,
                     temperature: float | jax.Array = 1.0, aggregation: str = "token-mean",
                     max_len: int | None = None, total_tokens=None, total_sequences=None,
                     compute_dtype=jnp.float32, loss_weights: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """Exact full-vocabulary reverse-KL OPD loss (module docstring, "exact").

    Args:
        student, teacher: both logits [B, T, V], or both (hidden [B, T, H], lm_head kernel [H, V]) pairs;
            pairs are computed in vocabulary chunks of `chunk` (required then).
        action_mask: [B, T] 0/1 on student-sampled tokens.
        aggregation, max_len, total_tokens, total_sequences: see `aggregate`.
        loss_weights: [B, T] per-token weights replacing action_mask in the aggregate (packed rows, as in
            `hat_jax.train.losses.clipped_policy_loss`); the metrics stay over action_mask.
    Returns:
        (loss = aggregate(KL_t, action_mask), metrics {reverse_kl: token mean, reverse_kl_max}).
    """
    check_aggregation(aggregation)
    pairs = isinstance(student, (tuple, list)), isinstance(teacher, (tuple, list))
    if pairs == (True, True):
        if chunk is None:
            raise ValueError("exact_reverse_kl: (hidden, kernel) inputs need a vocabulary chunk size")
        kl = reverse_kl_per_token_chunked(*student, *teacher, chunk=chunk, temperature=temperature,
                                          compute_dtype=compute_dtype)
    elif pairs == (False, False):
        kl = reverse_kl_per_token(student, teacher, temperature)
    else:
        raise ValueError("exact_reverse_kl: student and teacher must both be logits or both (hidden, kernel) pairs")
    loss = aggregate(kl, action_mask if loss_weights is None else loss_weights, aggregation, max_len, total_tokens,
                     total_sequences)
    sg = jax.lax.stop_gradient(kl)
    metrics = {"reverse_kl": masked_mean(sg, action_mask),
               "reverse_kl_max": jnp.max(jnp.where(action_mask != 0, sg, 0.0))}
    return loss, metrics
