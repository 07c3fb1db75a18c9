"""Test helpers shared across folders: a scripted stand-in for the decode function, and eos-biased micro params."""

from __future__ import annotations

import types

import jax
import numpy as np


def scripted_generate(tokenizer, text_for, append_eos: bool = False):
    """A `hat_jax.model.sampler.generate` stand-in: row r gets the tokens of text_for(decoded prompt r) (+ eos
    with `append_eos`), cut at max_new_tokens, logprob -1 per token."""
    eos = int(tokenizer.eos_token_id)

    def fake(params, config, ids, mask, rng, sampling, dtype=None, moe_impl=None, return_expert_ids=False):
        b, n = ids.shape[0], sampling.max_new_tokens
        tokens, lengths, finished = np.zeros((b, n), np.int32), np.zeros((b,), np.int32), np.zeros((b,), bool)
        for r in range(b):
            prompt = tokenizer.decode([int(t) for t in np.asarray(ids[r])[np.asarray(mask[r]).astype(bool)]],
                                      skip_special_tokens=False)
            out = tokenizer(text_for(prompt), add_special_tokens=False)["input_ids"] + ([eos] if append_eos else [])
            finished[r] = len(out) <= n
            out = out[:n]
            tokens[r, :len(out)], lengths[r] = out, len(out)
        lp = np.where(np.arange(n)[None] < lengths[:, None], -1.0, 0.0).astype(np.float32)
        return types.SimpleNamespace(tokens=tokens, logprobs=lp, lengths=lengths, finished=finished)

    return fake


def eos_biased_params(config, seed: int = 0) -> dict:
    """Random micro params that end turns now and then: embedding dimension 0 is 1 for every token (a constant
    direction in the residual stream) and lm_head row 0 is zero except the eos column (0.5), so eos has a
    probability of roughly 1/8 per token (a random micro model samples it 1/512 of the time)."""
    from hat_jax.model import init_params

    p = init_params(config, jax.random.key(seed))
    kernel = (p["lm_head"]["kernel"] * 10.0).at[0, :].set(0.0).at[0, config.eos_token_id].set(0.5)
    embed = p["model"]["embed_tokens"]["embedding"].at[:, 0].set(1.0)
    return {**p, "model": {**p["model"], "embed_tokens": {"embedding": embed}}, "lm_head": {"kernel": kernel}}


def recording_envs(monkeypatch) -> list:
    """Records the EnvConfig of every `LiveStreamEnv` that `hat_jax.rollout.rollout_episodes` creates, in
    creation order, into the returned list (for the duration of the test)."""
    import hat_jax.rollout.episodes as episodes_module
    from hat_jax.sim.env import LiveStreamEnv

    seen = []

    class Recording(LiveStreamEnv):
        def __init__(self, world, config=None, tool_runner=None):
            super().__init__(world, config, tool_runner)
            seen.append(config)

    monkeypatch.setattr(episodes_module, "LiveStreamEnv", Recording)
    return seen
