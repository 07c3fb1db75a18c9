"""The OPD stage's losses (`hat_jax.train.opd`): the reverse-KL loss function of the student, the entropy of its
next-token distribution (a metric), and the frozen teacher's forward that gives the batch its teacher columns.

Objective (the HAT report, arXiv 2608.15763 (TaoLive, 2026), "Training, three stages",
stage 2): GKD with lambda = 1 and the reverse-KL end (Agarwal et al. 2024, arXiv 2306.13649),
KL_t = KL(pi_s(.|c_t) || pi_T(.|c_t)) on the student's sampled completions, as
`hat_jax.train.kl` implements it (its docstring states both estimators, their sources and their biases):
- "sampled" (default; Thinking Machines' OPD, K. Lu 2025, tinker-cookbook; marin's JAX
  `sampled_token_reverse_kl_opd_loss`): `sampled_reverse_kl_loss`, per-token advantage
  A_t = -kl_coef (log pi_old(y_t) - log pi_T(y_t)) with importance ratio pi_theta / pi_old and optional
  PPO clip `clip_eps`. Unbiased for the gradient of sum_t KL_t at fixed contexts on-policy (discount 0: it
  ignores y_t's effect on later KL terms); biased off-policy and where the clip is active.
- "exact" (NeMo-RL's "full"): `exact_reverse_kl`, the full-vocabulary KL_t differentiated directly (no
  estimator, no ratio; `clip_eps` unused); exact per position, contexts sampled from pi_old.
Both divide every logit by the sampling temperature. top_p < 1 samples from a truncated distribution while
the recorded and trained logprobs are untruncated: biased (TRL #6789); the presets keep top_p = 1.

Teacher (`make_teacher_fn`): a jitted forward of the frozen teacher over the sampled rows, outside the
gradient, giving teacher token logprobs [B, T] (both losses: the sampled loss and the k1/k3 metrics) and, for
"exact", its final hidden states [B, T, H_T]. The exact loss computes the teacher logits inside the loss
function from those hidden states and the teacher's lm_head kernel, passed with the batch (broadcast over the
accumulation axis, under stop_gradient): memory B*T*H_T + accum*H_T*V instead of a [B, T, V] teacher-logit
array; with `vocab_chunk` set, neither model's [B, T, V] logits ever exist (`reverse_kl_per_token_chunked`).
The teacher may be a different architecture with the same vocabulary.

Loss function (params, micro, rng) -> (loss_sum, n, aux): loss_sum = `aggregate(per-token loss, action_mask,
aggregation, total_tokens=1, total_sequences=1)`, i.e. the aggregation's numerator, and n its denominator
(loss tokens for "token-mean"; rows with at least one action token for "seq-mean-token-mean" and
"seq-mean-token-sum-norm", whose constant L_max is max_new_tokens, or for "live" min(max_turns x
max_new_tokens, seq_len) as RL's), so the trainer's sum(loss_sum) / sum(n) over micro-batches equals the full
batch's aggregate. Plus lb_coef x the MoE load-balancing loss, plus mtp_coef x the MTP head's cross-entropy on
the student's sampled (action) tokens (`hat_jax.train.mtp`; skipped at mtp_coef = 0; with mtp_detach_trunk it
trains the `mtp.*` params only). Only the action
positions enter the loss (either loss: the exact KL is computed at every position and masked), so a "live"
episode's environment tokens are context for both models and never trained on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.model.process_sync import start_together
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.logprobs import token_logprobs, token_logprobs_chunked
from hat_jax.train.kl import exact_reverse_kl, sampled_reverse_kl_loss
from hat_jax.train.losses import masked_mean, token_entropy_chunked
from hat_jax.train.mtp import mtp_aux
from hat_jax.train.rl_loss import counted_sequences
from hat_jax.train.trainer import moe_aux, output_router_stats

if TYPE_CHECKING:
    from hat_jax.train.opd_config import OPDConfig


def _entropy(logits: jax.Array, temperature: float) -> jax.Array:
    """[B, T, V] -> [B, T] entropy of the next-token distribution (entry t: of position t-1's logits)."""
    lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32) / temperature, axis=-1)
    return jnp.pad(-jnp.sum(jnp.exp(lp) * lp, axis=-1), ((0, 0), (1, 0)))


def opd_loss_fn(model: Qwen3_5MoeForCausalLM, config: OPDConfig):
    """loss_fn(params, micro, rng) -> (aggregation numerator, its denominator, aux) (module docstring).

    micro: input_ids/attention_mask/action_mask [b, T] int32, old_logprobs/teacher_logprobs [b, T] float32;
    for "exact" also teacher_hidden [b, T, H_T] and teacher_kernel [H_T, V] (held out of the gradient).
    With config.mtp_coef > 0 the student's MTP block runs too and aux carries its `mtp_loss` on action_mask
    (training the `mtp.*` params only with config.mtp_detach_trunk).
    """
    chunk, temp, cd = config.vocab_chunk, config.temperature, COMPUTE_DTYPES[config.compute_dtype]
    top_k = model.config.num_experts_per_tok
    unpacked = dict(aggregation=config.aggregation, max_len=config.max_len, total_tokens=1.0, total_sequences=1.0)
    sg = jax.lax.stop_gradient
    mtp = config.mtp_coef > 0

    def loss_fn(params, micro, rng):
        del rng  # no dropout
        ids, m = micro["input_ids"], micro["action_mask"]
        old, tlp = micro["old_logprobs"], micro["teacher_logprobs"]
        packed = "segment_ids" in micro  # `hat_jax.train.policy_packing`: the aggregation in per-token weights
        rows = {"segment_ids": micro["segment_ids"]} if packed else {"attention_mask": micro["attention_mask"]}
        att = micro["segment_ids"] > 0 if packed else micro["attention_mask"]
        agg = (dict(aggregation="token-mean", total_tokens=1.0, loss_weights=micro["loss_weights"]) if packed
               else unpacked)
        out = model.apply({"params": params}, ids, return_logits=chunk is None, **rows,
                          **({"with_mtp": True, "mtp_detach_trunk": config.mtp_detach_trunk} if mtp else {}))
        kernel = params["lm_head"]["kernel"]
        if chunk is None:
            lp, ent = token_logprobs(out.logits, ids, temp), _entropy(sg(out.logits), temp)
        else:
            lp = token_logprobs_chunked(out.hidden, kernel, ids, chunk, temp, cd)
            ent = token_entropy_chunked(out.hidden, kernel, chunk, temp, cd)
        aux = moe_aux(output_router_stats(out, att, top_k))
        if config.loss == "sampled":
            loss_sum, met = sampled_reverse_kl_loss(lp, old, tlp, m, clip_eps=config.clip_eps, kl_coef=config.kl_coef,
                                                    **agg)
            aux["policy/clip_frac"] = met["clip_frac"]
        else:
            th, tk = sg(micro["teacher_hidden"]), sg(micro["teacher_kernel"])
            if chunk is None:
                t_logits = jnp.dot(th.reshape(-1, th.shape[-1]).astype(cd), tk.astype(cd)).reshape(*ids.shape, -1)
                loss_sum, met = exact_reverse_kl(out.logits, t_logits, m, temperature=temp, **agg)
            else:
                loss_sum, met = exact_reverse_kl((out.hidden, kernel), (th, tk), m, chunk=chunk, temperature=temp,
                                                 compute_dtype=cd, **agg)
            loss_sum = config.kl_coef * loss_sum
            aux["kl/reverse_exact"] = met["reverse_kl"]
            aux["policy/clip_frac"] = jnp.zeros((), jnp.float32)
        k1 = old.astype(jnp.float32) - tlp.astype(jnp.float32)
        aux["kl/reverse_k1"] = masked_mean(k1, m)
        aux["kl/reverse_k3"] = masked_mean(jnp.exp(-k1) - 1.0 + k1, m)
        aux["policy/ratio_mean"] = masked_mean(jnp.exp(sg(lp) - old), m)
        aux["policy/entropy"] = masked_mean(ent, m)
        if mtp:
            aux.update(mtp_aux(out, params, ids, m, att, top_k, segment_ids=micro.get("segment_ids"),
                               vocab_chunk=chunk, detach_trunk=config.mtp_detach_trunk, compute_dtype=cd))
        if packed:
            n = jnp.sum(micro["loss_counts"])
        else:
            n = jnp.sum(m.astype(jnp.float32)) if config.aggregation == "token-mean" else counted_sequences(m)
        return loss_sum, n, aux

    return loss_fn


def make_teacher_fn(model: Qwen3_5MoeForCausalLM, config: OPDConfig):
    """Jitted (teacher params, ids [b, T], mask [b, T]) -> {teacher_logprobs [b, T] float32 (at the sampling
    temperature), + teacher_hidden [b, T, H] for "exact"}."""
    chunk, temp, cd = config.vocab_chunk, config.temperature, COMPUTE_DTYPES[config.compute_dtype]

    @jax.jit
    def fn(params, ids, mask):
        out = model.apply({"params": params}, ids, attention_mask=mask, return_logits=chunk is None)
        if chunk is None:
            lp = token_logprobs(out.logits, ids, temp)
        else:
            lp = token_logprobs_chunked(out.hidden, params["lm_head"]["kernel"], ids, chunk, temp, cd)
        res = {"teacher_logprobs": lp}
        if config.loss == "exact":
            res["teacher_hidden"] = out.hidden
        return res

    return start_together(fn, "teacher")
