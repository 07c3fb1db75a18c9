"""Offline MTP draft acceptance: how often the MTP head's greedy draft equals the main model's greedy next token,
teacher-forced on held-out episodes (what greedy MTP speculative decoding would accept, without a sampler).

Accounting (speculative decoding, Leviathan et al. 2023, arXiv 2211.17192; the MTP drafter of DeepSeek-V3,
arXiv 2412.19437, section 5.4.3, and vLLM's `Qwen3_5MoeMTP`): at position t the main model has read tokens
x_0..x_{t+1} (x_{t+1} is the token it just emitted) and the MTP block drafts d_t = argmax MTP(h_t, x_{t+1}),
a guess of token t+2; the verifying main forward accepts it when d_t = g_{t+1} = argmax main(x_0..x_{t+1}),
its own greedy choice of token t+2. A position counts when tokens t+1 and t+2 are both generated (loss mask
1: an assistant token of a chat-rendered trajectory) and, in packed rows, in t's document. With one speculative
token the mean accepted length (tokens per verifying forward) is 1 + acceptance.

Deeper drafts (`chain_acceptance`, `acceptance_report(depth=k)`): d^j_t, the guess of token t+j+1, is the MTP
block applied to (its own depth j-1 output at t, d^{j-1}_t) in its KV cache, which holds the depth-1 entries of
positions <= t and the chain's own earlier depths, exactly as the sampler drafts (`hat_jax.model.speculative`);
d^j_t is accepted when d^1..d^j all equal the main model's greedy tokens g_{t+1}..g_{t+j}. The per-position
acceptance at depth j is the share of counted positions whose first j drafts are all accepted (vLLM's
per-position acceptance rate: accepted at position j / drafts), and with k speculative tokens the mean accepted
length is 1 + the sum over j <= k.

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
from hat_jax.model.speculative import init_mtp_cache, mtp_cached
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.logprobs import greedy_tokens_chunked
from hat_jax.sim.world_harness import world_harness


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


def _check_counts(owner: str, **counts: tuple[object, int]) -> None:
    """Raises ValueError naming `owner` and the first argument (name=(value, low)) that is not an int >= low."""
    for name, (value, low) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{owner}: {name} = {value!r}; expected an int >= {low}")


def chain_acceptance(greedy: jax.Array, drafts: jax.Array, loss_mask: jax.Array) -> dict[str, jax.Array]:
    """Per-depth acceptance counts of one batch of recursive MTP drafts (module docstring).

    Args:
        greedy: [B, T] int32, g_s the main model's greedy choice of token s+1 (teacher-forced).
        drafts: [B, T, k] int32, drafts[:, t, j-1] = d^j_t, the depth-j guess of token t+j+1.
        loss_mask: [B, T] 0/1 over generated tokens (padding 0).
    Returns:
        float32: "positions" (t with tokens t+1 and t+2 generated: the depth-1 count of `depth1_acceptance`) and
        "accepted" [k]: the counted positions whose drafts d^1..d^j all equal g_{t+1}..g_{t+j} and whose tokens
        t+2..t+j+1 are all generated (a draft past the end of the reply is never accepted).
    """
    b, t, k = drafts.shape
    m = loss_mask.astype(bool)
    shift = lambda a, j, fill: jnp.concatenate([a[:, j:], jnp.full((b, min(j, t)) + a.shape[2:], fill, a.dtype)],
                                               axis=1)[:, :t]
    counted = shift(m, 1, False) & shift(m, 2, False)
    ok, accepted = counted, []
    for j in range(1, k + 1):
        ok = ok & (drafts[:, :, j - 1] == shift(greedy, j, -1)) & shift(m, j + 1, False)
        accepted.append(jnp.sum(ok.astype(jnp.float32)))
    return {"positions": jnp.sum(counted.astype(jnp.float32)), "accepted": jnp.stack(accepted)}


def make_chain_fn(model: Qwen3_5MoeForCausalLM, depth: int, vocab_chunk: int | None = None, chain_rows: int = 64):
    """Jitted (params, input_ids [B, T], attention_mask [B, T]) -> (greedy [B, T] int32, drafts [B, T, depth]
    int32): the main model's teacher-forced greedy tokens and, at every position t, the MTP chain's greedy drafts
    d^1_t..d^depth_t (module docstring) as `hat_jax.model.speculative` drafts them.

    Depth 1 is the MTP block over all positions in its KV cache (slot t: (h_t, x_{t+1})). Depth j > 1 runs
    `chain_rows` positions at a time, each as a row with its own copy of that cache where only slots <= t (real
    tokens) are valid, the chain's entries appended after slot T-1 (their positions count the valid slots, so
    they are t+1, t+2, ..., as in the sampler). Memory: chain_rows copies of the one-layer MTP cache.
    With `vocab_chunk` the argmaxes are taken over vocabulary chunks (`greedy_tokens_chunked`).

    Raises:
        ValueError: depth < 1 or chain_rows < 1 (naming it).
    """
    _check_counts("make_chain_fn", depth=(depth, 1), chain_rows=(chain_rows, 1))
    config = model.config

    def argmax(params, hidden):                                             # [B, T, H] -> [B, T]
        if vocab_chunk is None:
            return jnp.argmax(model.apply({"params": params}, hidden, method=lambda m, h: m.lm_head(h)), axis=-1)
        return greedy_tokens_chunked(hidden, params["lm_head"]["kernel"], vocab_chunk, model.dtype)

    @jax.jit
    def fn(params, input_ids, attention_mask):
        b, t = input_ids.shape
        mtp = lambda h, ids, mask, cache: model.apply({"params": params}, h, ids, mask, cache, method=mtp_cached)
        out = model.apply({"params": params}, input_ids, attention_mask=attention_mask, return_logits=False)
        greedy = argmax(params, out.hidden).astype(jnp.int32)
        real = attention_mask.astype(bool)
        next_ids = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)))
        cache = {**init_mtp_cache(config, b, t + depth - 1, model.dtype), "index": 0}
        m1, cache = mtp(out.hidden, next_ids, real & jnp.pad(real[:, 1:], ((0, 0), (0, 1))), cache)
        d1 = argmax(params, m1).astype(jnp.int32)
        if depth == 1:
            return greedy, d1[..., None]
        n = b * t
        rows = -(-n // chain_rows) * chain_rows
        flat = jnp.minimum(jnp.arange(rows), n - 1).reshape(-1, chain_rows)  # padded rows repeat the last position
        slots = jnp.arange(t + depth - 1)

        def chain(idx):                                                     # idx [R] flat positions
            bi, ti = idx // t, idx % t
            layer = {key: value[bi] for key, value in cache["layers"][0].items()}
            valid = cache["valid"][bi] & (slots[None, :] <= ti[:, None])
            row_cache = {"index": jnp.asarray(t, jnp.int32), "valid": valid, "layers": [layer]}
            hidden, draft, out = m1[bi, ti][:, None], d1[bi, ti][:, None], []
            for _ in range(depth - 1):
                hidden, row_cache = mtp(hidden, draft, jnp.ones(draft.shape, bool), row_cache)
                draft = argmax(params, hidden).astype(jnp.int32)
                out.append(draft[:, 0])
            return jnp.stack(out, axis=1)                                   # [R, depth - 1]

        deeper = jax.lax.map(chain, flat).reshape(rows, depth - 1)[:n].reshape(b, t, depth - 1)
        return greedy, jnp.concatenate([d1[..., None], deeper], axis=-1)

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
    harness, out = world_harness(world.harness), []
    for record in records:
        ids, mask = render_tokens(tokenizer, harness, record["messages"])
        ids, mask = ids[:max_len], mask[:max_len]
        if mask.any():
            out.append((ids, mask))
    return out


def padded_batches(episodes: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int, bucket: int, pad_id: int):
    """Right-padded batches of (input_ids, loss_mask) episodes: dicts of [batch_size, L] int32 arrays (L the
    longest episode rounded up to a multiple of `bucket`); a last partial batch is filled with empty rows.

    Raises:
        ValueError: batch_size or bucket < 1 (naming it).
    """
    _check_counts("padded_batches", batch_size=(batch_size, 1), bucket=(bucket, 1))
    for i in range(0, len(episodes), batch_size):
        chunk = list(episodes[i:i + batch_size])
        width = -(-max(len(ids) for ids, _ in chunk) // bucket) * bucket
        ids = np.full((batch_size, width), pad_id, np.int32)
        att, loss = np.zeros((batch_size, width), np.int32), np.zeros((batch_size, width), np.int32)
        for r, (x, m) in enumerate(chunk):
            ids[r, :len(x)], att[r, :len(x)], loss[r, :len(x)] = x, 1, m
        yield {"input_ids": ids, "attention_mask": att, "loss_mask": loss}


def acceptance_report(model: Qwen3_5MoeForCausalLM, params, episodes: Sequence[tuple[np.ndarray, np.ndarray]], *,
                      batch_size: int = 4, bucket: int = 256, pad_id: int = 0, vocab_chunk: int | None = None,
                      depth: int = 1, chain_rows: int = 64) -> dict[str, Any]:
    """The acceptance figures of `episodes` ((input_ids [T], loss_mask [T]) int32 each) under `model`
    (`vocab_chunk`: as `make_acceptance_fn`), for drafts of depth 1..`depth` (`make_chain_fn`, `chain_rows`).

    Returns:
        {"episodes", "positions", "speculative_tokens": depth, "depths": [{"depth": j, "acceptance" (the share of
         depth j-1 acceptances also accepted at j: conditional), "per_position_acceptance" (the share of positions
         whose first j drafts are all accepted)} for j = 1..depth], "mean_accepted_length" (1 + the sum of the
         per-position acceptances: tokens per verifying forward with `depth` speculative tokens),
         "main_greedy_matches_data", "mtp_draft_matches_data" (depth 1)} (shares over the counted positions; 0 when
         none counts).
    Raises:
        ValueError: no episodes, depth < 1, or the model has no MTP block.
    """
    if not episodes:
        raise ValueError("acceptance_report: no episodes (every episode was empty or cut before its first "
                         "generated token)")
    if not model.config.mtp_num_hidden_layers:
        raise ValueError("acceptance_report: the model has no MTP block (mtp_num_hidden_layers = 0)")
    fn = make_acceptance_fn(model, vocab_chunk) if depth == 1 else None
    chain = None if depth == 1 else make_chain_fn(model, depth, vocab_chunk, chain_rows)
    sums = {"positions": 0.0, "accepted": 0.0, "main_correct": 0.0, "draft_correct": 0.0}
    accepted = np.zeros(depth)
    for batch in padded_batches(episodes, batch_size, bucket, pad_id):
        ids, att, loss = (jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "loss_mask"))
        if chain is None:
            got = jax.device_get(fn(params, ids, att, loss))
            accepted[0] += float(got["accepted"])
        else:
            greedy, drafts = chain(params, ids, att)
            got = jax.device_get(depth1_acceptance(None, None, ids, loss * att, greedy=greedy, draft=drafts[..., 0]))
            accepted += np.asarray(jax.device_get(chain_acceptance(greedy, drafts, loss * att)["accepted"]))
        for k in sums:
            sums[k] += float(got[k])
    n = max(sums["positions"], 1.0)
    per_position = accepted / n
    previous = np.concatenate([[n], accepted[:-1]])
    depths = [{"depth": j + 1, "acceptance": float(accepted[j] / max(previous[j], 1.0)),
               "per_position_acceptance": float(per_position[j])} for j in range(depth)]
    return {"episodes": len(episodes), "positions": int(sums["positions"]), "speculative_tokens": depth,
            "depths": depths, "mean_accepted_length": 1.0 + float(per_position.sum()),
            "main_greedy_matches_data": sums["main_correct"] / n, "mtp_draft_matches_data": sums["draft_correct"] / n}


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

    _check_counts("checkpoint_acceptance", items=(items, 1), max_len=(max_len, 3))
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
