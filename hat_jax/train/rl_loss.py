"""Device side of the HSA-RL stage: the policy forward, the clipped-ratio loss over micro-batches with the
aggregation's numerator/denominator split for gradient accumulation, the frozen reference's logprobs, and
the train step that applies `ppo_epochs x ppo_minibatches` optimizer updates per rollout batch.

Batch keys (host and device, rows = sequences; per-token arrays aligned with input_ids as in `hat_jax.rollout.logprobs.token_logprobs`):
  input_ids, attention_mask, action_mask (1 on sampled tokens of valid samples), old_logprobs [B, T];
  advantages [B] (one per sequence, broadcast over its tokens); ref_logprobs [B, T] when beta > 0;
  expert_ids [B, L, ceil(k/2), T] int32 when routing replay is on (row-leading so micro-batches split on rows;
  two ids per word, tokens last: `hat_jax.rollout.episodes.pack_expert_ids`; `forced_ids_rows` unpacks them
  to the model's `forced_expert_ids` layout [L, b*T, k]).
Packed rows (`hat_jax.train.policy_packing`, several sequences per row): segment_ids [B, T] replaces
  attention_mask, advantages are per token [B, T], and loss_weights / loss_counts [B, T] carry the aggregation.

Aggregation under accumulation (`hat_jax.train.trainer` divides the summed `loss_sum` of all micro-batches
by the summed `n`). With L the per-token loss, m the action mask, S the number of *counted* sequences (rows
with at least one action token: a dropped sample or an episode without sampled tokens is not a sequence
of the update) and L_max the constant generation budget:
  - "token-mean":              loss_sum = sum m L,                        n = sum m
  - "seq-mean-token-mean":     loss_sum = sum_i (sum_t m L / sum_t m),    n = S
  - "seq-mean-token-sum-norm": loss_sum = sum m L / L_max,                n = S
so sum(loss_sum) / sum(n) is exactly `hat_jax.train.losses.aggregate` of the whole batch (with
total_sequences = S), not a mean of micro-batch means (tested for each mode).

Policy forward: `Qwen3_5MoeForCausalLM` on the whole conversation, logits divided by the sampling
temperature (`token_logprobs(..., temperature)`, as marin's `compute_logprobs`; the sampler records
log_softmax(logits / T) before top-k/top-p). With routing replay (R3; Ma et al. 2025, arXiv 2510.11370;
NVIDIA/Megatron-LM#4168) the recorded sampling-time expert ids are forced in every MoE layer
(`hat_jax.model.moe.route`: ids replaced, gate weights = renormalised softmax of the *live* router logits
at those ids, so the router still gets gradients); the load-balancing loss and `moe/expert_load_cv` are
computed from the live router logits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from hat_jax.model.process_sync import start_together
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.episodes import unpack_expert_ids
from hat_jax.rollout.logprobs import token_logprobs, token_logprobs_chunked
from hat_jax.train.losses import aggregate, check_aggregation, clipped_policy_loss, masked_mean, token_entropy_chunked
from hat_jax.train.mtp import mtp_aux
from hat_jax.train.trainer import LossFn, TrainState, accumulate_gradients, finite_flag, moe_aux, output_router_stats

BATCH_KEYS = ("input_ids", "attention_mask", "action_mask", "old_logprobs", "advantages")
PACKED_KEYS = ("segment_ids", "loss_weights", "loss_counts")


def forced_ids_rows(expert_ids: jax.Array, k: int) -> jax.Array:
    """[B, L, ceil(k/2), T] packed row-leading routing ids (`hat_jax.rollout.episodes.pack_expert_ids`) -> the
    model's `forced_expert_ids` [L, B*T, k] int32."""
    ids = unpack_expert_ids(expert_ids, k)                                          # [B, L, T, k]
    b, num_layers, t, _ = ids.shape
    return jnp.transpose(ids, (1, 0, 2, 3)).reshape(num_layers, b * t, k)


def policy_forward(model: Qwen3_5MoeForCausalLM, params, batch: Mapping[str, jax.Array], temperature: float,
                   routing_replay: bool, vocab_chunk: int | None = None, with_mtp: bool = False,
                   mtp_detach_trunk: bool = True):
    """(token logprobs [B, T] at `temperature`, ModelOutput) of the policy on `batch` (module docstring). With
    `vocab_chunk` the logprobs stream the vocabulary in chunks (`token_logprobs_chunked`) and the output has no
    logits (no [B, T, V] array). `with_mtp` also runs the MTP block (its own routing, never replayed), reading
    the trunk under `stop_gradient` with `mtp_detach_trunk` (`hat_jax.train.mtp`)."""
    forced = forced_ids_rows(batch["expert_ids"], model.config.num_experts_per_tok) if routing_replay else None
    chunked = {} if vocab_chunk is None else {"return_logits": False}
    if with_mtp:
        chunked.update(with_mtp=True, mtp_detach_trunk=mtp_detach_trunk)
    rows = ({"segment_ids": batch["segment_ids"]} if "segment_ids" in batch
            else {"attention_mask": batch["attention_mask"]})
    out = model.apply({"params": params}, batch["input_ids"], forced_expert_ids=forced, **rows, **chunked)
    if vocab_chunk is None:
        return token_logprobs(out.logits, batch["input_ids"], temperature), out
    return token_logprobs_chunked(out.hidden, params["lm_head"]["kernel"], batch["input_ids"], vocab_chunk,
                                  temperature, model.dtype), out


def token_entropy(logits: jax.Array, temperature: float) -> jax.Array:
    """[B, T] entropy of the next-token distribution that predicts token t (entry 0 = 0), at `temperature`."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32) / temperature, axis=-1)
    return jnp.pad(-jnp.sum(jnp.exp(logp) * logp, axis=-1), ((0, 0), (1, 0)))


def counted_sequences(action_mask: jax.Array) -> jax.Array:
    """Number of rows with at least one action token (float32 scalar): S of the module docstring."""
    return jnp.sum(jnp.any(action_mask != 0, axis=-1).astype(jnp.float32))


def rl_loss_fn(model: Qwen3_5MoeForCausalLM, *, temperature: float = 1.0, eps_low: float = 0.2,
               eps_high: float = 0.28, beta: float = 0.0, aggregation: str = "token-mean", max_len: int | None = None,
               routing_replay: bool = False, vocab_chunk: int | None = None, mtp: bool = False,
               mtp_detach_trunk: bool = True) -> LossFn:
    """loss_fn(params, micro, rng) -> (loss_sum, n, aux) for `hat_jax.train.trainer` (module docstring).

    Per token: `clipped_policy_loss` (max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)) + beta k3(logp,
    ref)), DeepSeekMath eq. 3 with DAPO's clip-higher; aggregated as `aggregation`.

    Args:
        model: the policy module (its compute dtype). temperature: the sampler's.
        eps_low, eps_high: clip range. beta: k3 KL coefficient (needs micro["ref_logprobs"] when > 0).
        aggregation: one of `hat_jax.train.losses.AGGREGATIONS`.
        max_len: L_max of "seq-mean-token-sum-norm" (required by it).
        routing_replay: force micro["expert_ids"] in the forward.
        vocab_chunk: None = full [B, T, V] logits; else logprobs and entropy over vocabulary chunks of this size.
        mtp: also run the MTP block; aux then has `mtp_loss`, its cross-entropy on the action tokens with no
            advantage weight (`hat_jax.train.mtp.mtp_aux`), and moe/mtp_expert_load_cv.
        mtp_detach_trunk: the MTP loss trains the `mtp.*` params only (True, the default: the policy gradient is
            the same with and without it); False also sends it into the trunk, embedding and lm_head.
    Returns:
        the loss function; aux = moe_aux (lb_loss, moe/expert_load_cv) plus policy/clip_frac, policy/clip_frac_low,
        policy/clip_frac_high, policy/ratio_mean, policy/ratio_max, policy/entropy (token mean over action tokens),
        kl/approx (k3 estimate of KL(pi_old || pi_theta)) and, when beta > 0, kl/k3 (token mean of k3 to the
        reference). Metrics are per micro-batch and averaged over micro-batches by the trainer.
    Raises:
        ValueError: unknown aggregation (lists the valid ones), or sum-norm without max_len.
    """
    check_aggregation(aggregation)
    if aggregation == "seq-mean-token-sum-norm" and not max_len:
        raise ValueError("aggregation 'seq-mean-token-sum-norm' needs max_len (the constant generation budget)")
    top_k = model.config.num_experts_per_tok

    def loss_fn(params, micro, rng):
        del rng  # no dropout
        lp, out = policy_forward(model, params, micro, temperature, routing_replay, vocab_chunk, mtp,
                                 mtp_detach_trunk)
        mask = micro["action_mask"]
        ref = micro["ref_logprobs"] if beta > 0 else None
        packed = "segment_ids" in micro
        agg = ({"aggregation": "token-mean", "loss_weights": micro["loss_weights"]} if packed
               else {"aggregation": aggregation, "max_len": max_len})
        loss_sum, m = clipped_policy_loss(lp, micro["old_logprobs"], micro["advantages"], mask, eps_low=eps_low,
                                          eps_high=eps_high, ref_logprobs=ref, beta=beta, total_tokens=1.0,
                                          total_sequences=1.0, **agg)
        if packed:
            n = jnp.sum(micro["loss_counts"])
        else:
            n = jnp.sum(mask.astype(jnp.float32)) if aggregation == "token-mean" else counted_sequences(mask)
        token_mask = micro["segment_ids"] > 0 if packed else micro["attention_mask"]
        if vocab_chunk is None:
            ent = token_entropy(jax.lax.stop_gradient(out.logits), temperature)
        else:
            ent = token_entropy_chunked(out.hidden, params["lm_head"]["kernel"], vocab_chunk, temperature,
                                        model.dtype)
        ent = masked_mean(jax.lax.stop_gradient(ent), mask)
        aux = moe_aux(output_router_stats(out, token_mask, top_k))
        aux.update({"policy/clip_frac": m["clip_frac"], "policy/clip_frac_low": m["clip_frac_low"],
                    "policy/clip_frac_high": m["clip_frac_high"], "policy/ratio_mean": m["ratio_mean"],
                    "policy/ratio_max": m["ratio_max"], "policy/entropy": ent, "kl/approx": m["approx_kl"]})
        if beta > 0:
            aux["kl/k3"] = m["kl"]
        if mtp:
            aux.update(mtp_aux(out, params, micro["input_ids"], mask, token_mask, top_k,
                               segment_ids=micro.get("segment_ids"), vocab_chunk=vocab_chunk,
                               detach_trunk=mtp_detach_trunk, compute_dtype=model.dtype))
        return loss_sum, n, aux

    return loss_fn


def batch_aggregate(per_token: jax.Array, mask: jax.Array, aggregation: str, max_len: int | None = None) -> jax.Array:
    """`aggregate` of a whole batch with S = `counted_sequences` (the reference the accumulation must equal)."""
    return aggregate(per_token, mask, aggregation, max_len, total_sequences=counted_sequences(mask))


def make_ref_logprobs(model: Qwen3_5MoeForCausalLM, temperature: float, vocab_chunk: int | None = None) -> Callable:
    """Jitted (ref_params, input_ids, attention_mask) -> [B, T] logprobs of the frozen reference at the sampling
    temperature (its own routing: the recorded ids belong to the policy); vocabulary-chunked with `vocab_chunk`."""

    @jax.jit
    def ref_logprobs(params, input_ids, attention_mask):
        lp, _ = policy_forward(model, params, {"input_ids": input_ids, "attention_mask": attention_mask},
                               temperature, False, vocab_chunk)
        return lp

    return start_together(ref_logprobs, "ref_logprobs")


def make_rl_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, *, accum_steps: int,
                       epochs: int = 1, minibatches: int = 1, lb_coef: float = 0.0, mtp_coef: float = 0.0,
                       schedule: optax.Schedule | None = None, shardings: TrainState | None = None,
                       donate: bool = True) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict]]:
    """The jitted RL step: `epochs x minibatches` optimizer updates on one rollout batch.

    The batch's leaves are [minibatches * accum_steps, micro, ...] (`split_micro_batches` with
    minibatches * accum_steps): minibatch j is the contiguous block of rows j*B/M..(j+1)*B/M-1 (rows are
    task-major, so it holds whole groups when B/M is a multiple of G), the same blocks in the same order every
    epoch (no reshuffle). Each update is `accumulate_gradients` over that minibatch's accum_steps micro-batches,
    then the optimizer (clipping + AdamW). old_logprobs stay the sampler's, so after the first update the ratio
    moves away from 1 and the clip acts (PPO). With epochs = minibatches = 1 this is one on-policy update, the
    same as `hat_jax.train.trainer.make_train_step`.

    `TrainState.step` counts rollout batches (RL steps), the optimizer's own count updates; `lr` reports the
    schedule at the first update of the step (the optimizer's count state.step * epochs * minibatches).

    Returns:
        train_step(state, batch) -> (state, metrics): the mean over the updates of `accumulate_gradients`' stats and
        grad_norm, plus lr and finite (`finite_flag` of the final params).
    """
    updates_per_step = epochs * minibatches

    def step(state: TrainState, batch: Mapping[str, jax.Array]):
        rng, params, opt_state = state.rng, state.params, state.opt_state
        history = []
        for _ in range(epochs):
            for j in range(minibatches):
                rng, r = jax.random.split(rng)
                mini = {k: v[j * accum_steps:(j + 1) * accum_steps] for k, v in batch.items()}
                grads, metrics = accumulate_gradients(loss_fn, params, mini, r, lb_coef, mtp_coef)
                metrics["grad_norm"] = optax.tree.norm(grads)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
                history.append(metrics)
        metrics = {k: sum(h[k] for h in history) / len(history) for k in history[0]}
        metrics["finite"] = finite_flag(metrics, params)
        new = TrainState(params, opt_state, state.step + 1, rng)
        if shardings is not None:
            new = jax.lax.with_sharding_constraint(new, shardings)
        if schedule is not None:
            metrics["lr"] = jnp.asarray(schedule(state.step * updates_per_step), jnp.float32)
        return new, metrics

    return start_together(jax.jit(step, donate_argnums=(0,) if donate else ()), "rl_step")
