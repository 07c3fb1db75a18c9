"""Offline MTP draft acceptance: how often the MTP head's greedy draft equals the main model's greedy next token,
teacher-forced on held-out episodes (what greedy MTP speculative decoding would accept, without a sampler).

Accounting (speculative decoding, Leviathan et al. 2023, arXiv 2211.17192; the MTP drafter of DeepSeek-V3,
arXiv 2412.19437, section 5.4.3, and vLLM's `Qwen3_5MoeMTP`): at position t the main model has read tokens
x_0..x_{t+1} (x_{t+1} is the token it just emitted) and the MTP block drafts d_t = argmax MTP(h_t, x_{t+1}),
a guess of token t+2; the verifying main forward accepts it when d_t = g_{t+1} = argmax main(x_0..x_{t+1}),
its own greedy choice of token t+2. A position counts when tokens t+1 and t+2 are both generated (loss mask
1: an assistant token of a chat-rendered trajectory) and, in packed rows, in t's document. With one speculative
token the mean accepted length (tokens per verifying forward) is 1 + acceptance.

Depth 1 only: deeper drafts apply the MTP block recursively, whose attention then mixes the depth-1 states of
earlier positions with the chain's own (a cached MTP forward per position); not computed here.

Teacher-forced on the episode's tokens: on the model's own greedy trajectories this is exactly what greedy
speculative decoding accepts; on other ones (oracle trajectories) the prefix is the episode's, not the model's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.data.world_data import WorldDataConfig, eval_items, oracle_records
from hat_jax.harness.render import render_tokens
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.logprobs import greedy_tokens_chunked
from hat_jax.sim.world_harness import production_harness


def depth1_acceptance(logits: jax.Array | None, mtp_logits: jax.Array | None, input_ids: jax.Array,
                      loss_mask: jax.Array, segment_ids: jax.Array | None = None, *,
                      greedy: jax.Array | None = None, draft: jax.Array | None = None) -> dict[str, jax.Array]:
    """Per-position depth-1 acceptance counts of one batch (module docstring).

    Args:
        logits: [B, T, V] main logits (position t predicts token t+1). mtp_logits: [B, T, V] (position t
            predicts token t+2). input_ids: [B, T] int32. loss_mask: [B, T] 0/1 over generated tokens.
        segment_ids: [B, T] int32 of packed rows, or None.
        greedy, draft: [B, T] int32, their argmaxes already taken (`greedy_tokens_chunked`); then logits and
            mtp_logits are not read (pass None).
    Returns:
        float32 scalars: positions (counted), accepted (d_t == g_{t+1}), main_correct (g_{t+1} == x_{t+2}),
        draft_correct (d_t == x_{t+2}).
    """
    t = input_ids.shape[1]
    greedy = jnp.argmax(logits, axis=-1) if greedy is None else greedy     # g_s: the main model's token s+1
    draft = jnp.argmax(mtp_logits, axis=-1) if draft is None else draft    # d_s: the MTP guess of token s+2
    m = loss_mask.astype(bool)
    counted = m[:, 1:t - 1] & m[:, 2:]
    if segment_ids is not None:
        counted = counted & (segment_ids[:, 2:] == segment_ids[:, :t - 2]) & (segment_ids[:, :t - 2] > 0)
    d, g, x = draft[:, :t - 2], greedy[:, 1:t - 1], input_ids[:, 2:]
    f = lambda a: jnp.sum((a & counted).astype(jnp.float32))
    return {"positions": jnp.sum(counted.astype(jnp.float32)), "accepted": f(d == g), "main_correct": f(g == x),
            "draft_correct": f(d == x)}


def make_acceptance_fn(model: Qwen3_5MoeForCausalLM, vocab_chunk: int | None = None):
    """Jitted (params, input_ids [B, T], attention_mask [B, T], loss_mask [B, T]) -> `depth1_acceptance` of
    the model's teacher-forced forward with the MTP block. With `vocab_chunk` the argmaxes are taken over
    vocabulary chunks from the hidden states (`greedy_tokens_chunked`: no [B, T, V] logits; the same tokens).

    Raises (when called):
        ValueError: the model has no MTP block.
    """

    @jax.jit
    def fn(params, input_ids, attention_mask, loss_mask):
        out = model.apply({"params": params}, input_ids, attention_mask=attention_mask, with_mtp=True,
                          return_logits=vocab_chunk is None)
        mask = loss_mask * attention_mask
        if vocab_chunk is None:
            return depth1_acceptance(out.logits, out.mtp_logits, input_ids, mask)
        kernel = params["lm_head"]["kernel"]
        greedy = greedy_tokens_chunked(out.hidden, kernel, vocab_chunk, model.dtype)
        draft = greedy_tokens_chunked(out.mtp_hidden, kernel, vocab_chunk, model.dtype)
        return depth1_acceptance(None, None, input_ids, mask, greedy=greedy, draft=draft)

    return fn


def live_qa_oracle_episodes(tokenizer, world: WorldDataConfig, max_len: int | None = None
                            ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Held-out episodes: the oracle's trajectories of the `live_qa` eval items (no viewer message of a training
    task, `hat_jax.data.world_data.eval_items`; the original harness, no tool faults), rejection-sampled as SFT
    records are (`oracle_records`) and rendered with the chat template under the production harness
    (`render_tokens`: loss mask 1 on assistant-generated tokens).

    Args:
        tokenizer: the checkpoint's tokenizer. world: the world and the number of items (`eval_items`).
        max_len: episodes are cut to this many tokens (None: whole).
    Returns:
        [(input_ids [T] int32, loss_mask [T] int32)], episodes without a generated token dropped.
    """
    tasks = [item.task for item in eval_items("live_qa", world)]
    records, _ = oracle_records(dataclasses.replace(world, sft_fault_rates={}), tasks, prefix="mtp")
    harness, out = production_harness(), []
    for record in records:
        ids, mask = render_tokens(tokenizer, harness, record["messages"])
        ids, mask = ids[:max_len], mask[:max_len]
        if mask.any():
            out.append((ids, mask))
    return out


def padded_batches(episodes: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int, bucket: int, pad_id: int):
    """Right-padded batches of (input_ids, loss_mask) episodes: dicts of [batch_size, L] int32 arrays (L the
    longest episode rounded up to a multiple of `bucket`); a last partial batch is filled with empty rows."""
    for i in range(0, len(episodes), batch_size):
        chunk = list(episodes[i:i + batch_size])
        width = -(-max(len(ids) for ids, _ in chunk) // bucket) * bucket
        ids = np.full((batch_size, width), pad_id, np.int32)
        att, loss = np.zeros((batch_size, width), np.int32), np.zeros((batch_size, width), np.int32)
        for r, (x, m) in enumerate(chunk):
            ids[r, :len(x)], att[r, :len(x)], loss[r, :len(x)] = x, 1, m
        yield {"input_ids": ids, "attention_mask": att, "loss_mask": loss}


def acceptance_report(model: Qwen3_5MoeForCausalLM, params, episodes: Sequence[tuple[np.ndarray, np.ndarray]], *,
                      batch_size: int = 4, bucket: int = 256, pad_id: int = 0, vocab_chunk: int | None = None
                      ) -> dict[str, Any]:
    """The acceptance figures of `episodes` ((input_ids [T], loss_mask [T]) int32 each) under `model`
    (`vocab_chunk`: as `make_acceptance_fn`).

    Returns:
        {"episodes", "positions", "depths": [{"depth": 1, "acceptance", "per_position_acceptance"}],
         "mean_accepted_length" (1 + acceptance, one speculative token), "main_greedy_matches_data",
         "mtp_draft_matches_data"} (shares over the counted positions; 0 when none counts).
    Raises:
        ValueError: no episodes, or the model has no MTP block.
    """
    if not episodes:
        raise ValueError("acceptance_report: no episodes")
    if not model.config.mtp_num_hidden_layers:
        raise ValueError("acceptance_report: the model has no MTP block (mtp_num_hidden_layers = 0)")
    fn = make_acceptance_fn(model, vocab_chunk)
    sums = {"positions": 0.0, "accepted": 0.0, "main_correct": 0.0, "draft_correct": 0.0}
    for batch in padded_batches(episodes, batch_size, bucket, pad_id):
        got = jax.device_get(fn(params, *(jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask",
                                                                         "loss_mask"))))
        for k in sums:
            sums[k] += float(got[k])
    n = max(sums["positions"], 1.0)
    acceptance = sums["accepted"] / n
    return {"episodes": len(episodes), "positions": int(sums["positions"]),
            "depths": [{"depth": 1, "acceptance": acceptance, "per_position_acceptance": acceptance}],
            "mean_accepted_length": 1.0 + acceptance, "main_greedy_matches_data": sums["main_correct"] / n,
            "mtp_draft_matches_data": sums["draft_correct"] / n}


# The compact figures an evaluation reports (`checkpoint_acceptance`, results.json's "mtp").
FIGURE_KEYS = ("acceptance_depth1", "mean_accepted_length", "positions", "episodes")


def checkpoint_acceptance(model: Qwen3_5MoeForCausalLM, params, tokenizer, world: WorldDataConfig, *, items: int,
                          max_len: int, batch_size: int = 4, bucket: int = 256, pad_id: int = 0,
                          vocab_chunk: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The depth-1 acceptance of a checkpoint on the oracle trajectories of `items` held-out `live_qa` eval items
    (`live_qa_oracle_episodes` of `world` with `eval_items = items`, cut to `max_len` tokens).

    Args:
        model, params: the checkpoint (the model must have an MTP block). tokenizer: its tokenizer.
        world: the evaluation's world (its SFT/RL task counts keep training messages out of the items).
        items: eval items (>= 1). max_len: tokens per episode (>= 3). batch_size, bucket, pad_id, vocab_chunk:
            as `acceptance_report`.
    Returns:
        (figures {"acceptance_depth1": share in [0, 1], "mean_accepted_length": 1 + acceptance (tokens per
         verifying forward with one speculative token), "positions": int, "episodes": int},
         details {"items", "max_len", "main_greedy_matches_data", "mtp_draft_matches_data", "wall_s"}).
    Raises:
        ValueError: items < 1 or max_len < 3 (names the argument); no episode with a generated token; the model
            has no MTP block.
    """
    import time

    for name, value, low in (("items", items, 1), ("max_len", max_len, 3)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"checkpoint_acceptance: {name} = {value!r}; expected an int >= {low}")
    t0 = time.perf_counter()
    episodes = live_qa_oracle_episodes(tokenizer, dataclasses.replace(world, eval_items=items), max_len)
    report = acceptance_report(model, params, episodes, batch_size=batch_size, bucket=bucket, pad_id=pad_id,
                               vocab_chunk=vocab_chunk)
    acceptance = report["depths"][0]["acceptance"]
    figures = {"acceptance_depth1": acceptance, "mean_accepted_length": report["mean_accepted_length"],
               "positions": report["positions"], "episodes": report["episodes"]}
    details = {"items": items, "max_len": max_len, "main_greedy_matches_data": report["main_greedy_matches_data"],
               "mtp_draft_matches_data": report["mtp_draft_matches_data"], "wall_s": time.perf_counter() - t0}
    return figures, details
