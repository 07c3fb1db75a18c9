"""The multi-token-prediction (MTP) loss of the training stages: the MTP head's cross-entropy on the stage's own
loss tokens, added as `mtp_coef x mtp_loss` (DeepSeek-V3, arXiv 2412.19437, section 2.2 eq. 24-25, depth D = 1).

Convention (every stage the same):
- Targets: the MTP block at position t (inputs: the main model's post-norm hidden h_t and token t+1) predicts
  token t+2; position t counts where the stage's own loss mask is 1 at t+2 (SFT and pretraining: the loss
  mask; OPD and RL: the action mask of the sampled tokens, never weighted by an advantage: the head learns to
  predict the policy's tokens, it is not itself a policy) and, in packed rows, t and t+2 are in one document.
- Value: the token mean over those positions (`hat_jax.model.transformer.mtp_loss`), computed from the MTP
  block's hidden states and the shared lm_head on the blocks of positions that hold a target only
  (`mtp_ce_counted_rows`); with `vocab_chunk` over vocabulary chunks (`mtp_ce_chunked`), so no [B, T, V]
  array exists.
- Gradient: pretraining and SFT (always): into the MTP block and, as in DeepSeek-V3 (its MTP modules share the
  embedding, the output head and the trunk whose h_t they read), into the main model through h_t, the embedding
  and the lm_head. RL and OPD (`mtp_detach_trunk`, default True; verl's `detach_encoder`, which its MTP guide
  recommends for RL): into the MTP block only. There the loss imitates the policy's own samples, and
  through the trunk it would add an unweighted self-imitation term to the policy gradient (measured on tiny:
  docs/tuning.md, "MTP in the policy stages").
- Accumulation: the trainer weights each micro-batch's mtp_loss by its share of the stage's normaliser, as the
  load-balancing loss (`hat_jax.train.trainer`): with one micro-batch, total = main + mtp_coef x mtp_loss.
- The MTP layer's router is not in the load-balancing loss (`lb_loss` stays the main model's layers, the
  same with and without MTP); its balance is logged as `moe/mtp_expert_load_cv`. vLLM serves the MTP layer
  with the routing it learned; DeepSeek-V3's balancing is for the main model's experts and its parallel layout.
- `mtp_coef = 0` skips the MTP forward: the step is exactly the one without MTP (tests/train/test_mtp_loss.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hat_jax.model.router_stats import expert_load_cv, router_stats
from hat_jax.model.transformer import mtp_loss
from hat_jax.rollout.logprobs import token_logprobs_chunked
from hat_jax.train.losses import COUNTED_BLOCK_ROWS, counted_rows_nll_sum

# DeepSeek-V3 (arXiv 2412.19437, section 4.2): lambda = 0.3 for the first 10T tokens, 0.1 for the rest; slime's
# and Megatron's `mtp_loss_scaling_factor` default 0.1. The stage configs' default.
DEFAULT_MTP_COEF = 0.1


def check_mtp_coef(owner: str, coef: float) -> float:
    """Returns `coef` when it is a finite number >= 0.

    Raises:
        ValueError: naming `<owner>.mtp_coef`, the value and what is expected.
    """
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not coef >= 0 or coef == float("inf"):
        raise ValueError(f"{owner}.mtp_coef = {coef!r}: expected a finite number >= 0 (0 = no MTP loss)")
    return coef


def check_mtp_model(owner: str, coef: float, model_config) -> None:
    """Raises ValueError naming `<owner>.mtp_coef` when coef > 0 and the model has no MTP block."""
    if coef > 0 and not model_config.mtp_num_hidden_layers:
        raise ValueError(f"{owner}.mtp_coef = {coef}: the model has no MTP block (mtp_num_hidden_layers = 0); "
                         f"set mtp_coef=0 or use a model with mtp_num_hidden_layers=1")


def mtp_target_mask(input_ids: jax.Array, loss_mask: jax.Array | None = None,
                    segment_ids: jax.Array | None = None) -> jax.Array:
    """Where position t's MTP target (token t+2) is trained (module docstring), as `mtp_loss` counts it.

    Args:
        input_ids: [B, T] int32. loss_mask: [B, T] 0/1 over target tokens, or None (all).
        segment_ids: [B, T] int32 of packed rows, or None.
    Returns:
        [B, T - 2] float32: entry t for position t (the last two positions have no target).
    """
    b, t = input_ids.shape
    mask = jnp.ones((b, t - 2), jnp.float32) if loss_mask is None else loss_mask[:, 2:].astype(jnp.float32)
    if segment_ids is not None:
        mask = mask * ((segment_ids[:, 2:] == segment_ids[:, :-2]) & (segment_ids[:, :-2] > 0))
    return mask


def mtp_ce_chunked(mtp_hidden: jax.Array, lm_head_kernel: jax.Array, input_ids: jax.Array,
                   loss_mask: jax.Array | None = None, segment_ids: jax.Array | None = None, chunk: int = 8192,
                   compute_dtype=jnp.float32) -> jax.Array:
    """`mtp_loss(mtp_hidden @ lm_head_kernel, input_ids, loss_mask, segment_ids)` over vocabulary chunks.

    `token_logprobs_chunked` of the targets shifted by one more token: its entry t + 1 is log p(token t+2)
    under position t's MTP logits.

    Args:
        mtp_hidden: [B, T, H] (`ModelOutput.mtp_hidden`). lm_head_kernel: [H, V] (the shared `lm_head/kernel`).
        input_ids: [B, T] int32. loss_mask, segment_ids: as `mtp_target_mask`.
        chunk: vocabulary chunk width (clipped to V). compute_dtype: the matmul dtype (accumulation float32).
    Returns:
        float32 scalar: the token mean of -log p over `mtp_target_mask` (0 when it is empty).
    """
    t = input_ids.shape[1]
    next_ids = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)))
    lp = token_logprobs_chunked(mtp_hidden, lm_head_kernel, next_ids, chunk, compute_dtype=compute_dtype)
    mask = mtp_target_mask(input_ids, loss_mask, segment_ids)
    nll = -lp[:, 1:t - 1]
    return jnp.sum(jnp.where(mask != 0, nll * mask, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)


def mtp_ce_counted_rows(mtp_hidden: jax.Array, lm_head_kernel: jax.Array, input_ids: jax.Array,
                        loss_mask: jax.Array | None = None, segment_ids: jax.Array | None = None,
                        rows: int = COUNTED_BLOCK_ROWS, compute_dtype=jnp.float32) -> jax.Array:
    """`mtp_loss(mtp_hidden @ lm_head_kernel, ...)` with the lm_head run only on blocks of `rows` positions that
    hold a counted target (`hat_jax.train.losses.counted_rows_nll_sum`).

    Args:
        mtp_hidden: [B, T, H]. lm_head_kernel: [H, V]. input_ids: [B, T] int32. loss_mask, segment_ids: as
        `mtp_target_mask`. rows: positions per block. compute_dtype: the matmul dtype (logits float32).
    Returns:
        float32 scalar, as `mtp_ce_chunked`.
    """
    b, t, h = mtp_hidden.shape
    mask = mtp_target_mask(input_ids, loss_mask, segment_ids)
    targets = jnp.pad(input_ids[:, 2:], ((0, 0), (0, 2))).reshape(-1)
    total = counted_rows_nll_sum(mtp_hidden.reshape(b * t, h), lm_head_kernel, targets,
                                 jnp.pad(mask, ((0, 0), (0, 2))).reshape(-1), rows, compute_dtype)
    return total / jnp.maximum(jnp.sum(mask), 1.0)


def mtp_aux(out, params, input_ids: jax.Array, loss_mask: jax.Array, token_mask: jax.Array, top_k: int, *,
            segment_ids: jax.Array | None = None, vocab_chunk: int | None = None,
            block_rows: int | None = COUNTED_BLOCK_ROWS, detach_trunk: bool = False,
            compute_dtype=jnp.float32) -> dict[str, jax.Array]:
    """The MTP entries of a stage loss function's aux dict, from a forward with `with_mtp=True`.

    Args:
        out: the `ModelOutput` (its mtp_hidden and mtp_router_logits).
        params: the model params (their `lm_head/kernel`). input_ids: [B, T] int32.
        loss_mask: [B, T] the stage's loss tokens (module docstring). token_mask: [B, T] non-padding tokens.
        top_k: experts per token. segment_ids: packed rows or None. vocab_chunk: None = full logits.
        block_rows: without vocab_chunk, the positions per block of `mtp_ce_counted_rows`; None = the forward's
            own [B, T, V] `out.mtp_logits` (one matmul over every position, as XLA's cost model counts it).
        detach_trunk: the forward ran with `mtp_detach_trunk=True`; the shared lm_head is read under
            `stop_gradient` too, so `mtp_loss` trains the `mtp.*` params only (the policy stages' setting).
    Returns:
        {"mtp_loss": float32 scalar (differentiated; the trainer weights it by mtp_coef),
         "moe/mtp_expert_load_cv": the MTP router's `expert_load_cv` (no gradient)}.
    """
    kernel = params["lm_head"]["kernel"]
    if detach_trunk:
        kernel = jax.lax.stop_gradient(kernel)
    if vocab_chunk is None and block_rows is None:
        logits = out.mtp_logits
        if detach_trunk:  # the forward's logits carry the lm_head's gradient: the same matmul on the held kernel
            logits = jnp.einsum("bth,hv->btv", out.mtp_hidden.astype(compute_dtype), kernel.astype(compute_dtype),
                                preferred_element_type=jnp.float32)
        loss = mtp_loss(logits, input_ids, loss_mask, segment_ids)
    elif vocab_chunk is None:  # out.mtp_logits goes unused (removed from the jitted step)
        loss = mtp_ce_counted_rows(out.mtp_hidden, kernel, input_ids, loss_mask, segment_ids, block_rows,
                                   compute_dtype)
    else:
        loss = mtp_ce_chunked(out.mtp_hidden, kernel, input_ids, loss_mask, segment_ids, vocab_chunk, compute_dtype)
    stats = router_stats(jax.lax.stop_gradient(out.mtp_router_logits), top_k, token_mask.reshape(-1))
    return {"mtp_loss": loss, "moe/mtp_expert_load_cv": expert_load_cv(stats)}
