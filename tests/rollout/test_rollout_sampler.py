"""Tests of hat_jax.rollout.sampler: buckets, `JaxSampler`'s rows / padding / routing layout on the micro model,
and the `Sampler` protocol as the plug-in point: an engine written against it alone drives `rollout_episodes`
to the same batch as the JAX sampler."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from policy_helpers import scripted_generate as scripted

from hat_jax.model.sampler import generate, left_pad
from hat_jax.model.sampling import SamplingConfig
from hat_jax.rollout import Generation, JaxSampler, RolloutConfig, rollout_episodes
from hat_jax.rollout.sampler import batch_bucket, prompt_bucket, round_up
from hat_jax.sim.viewers import sample_tasks
from hat_jax.train.rl import RLConfig


def test_buckets(config):
    assert [round_up(n, 64) for n in (1, 64, 65, 200)] == [64, 64, 128, 256]
    assert [batch_bucket(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8] and batch_bucket(5, 6) == 6
    limit = config.max_position_embeddings - 16
    assert prompt_bucket(65, config, 16, 64) == 128 and prompt_bucket(limit - 3, config, 16, 64) == limit


def test_jax_sampler_rows_and_routing_equal_a_direct_generate(params, config, tokenizer):
    """Extra rows repeat the first prompt and are dropped; each kept row equals `generate` on the same padded
    batch, prompt routing aligned at the end."""
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6, stop_token_ids=(2,))
    rng = jax.random.key(3)
    gen = JaxSampler(params, config, tokenizer, bucket=8).generate(prompts, sampling, rng, rows=4, expert_ids=True)
    ids, mask = left_pad([*prompts, prompts[0], prompts[0]], 0, 8)
    ref = jax.device_get(generate(params, config, ids, mask, rng, sampling, return_expert_ids=True))
    assert gen.batch_shape == (4, 8) and gen.tokens.shape == (2, 6) and gen.expert_ids.shape[1] == 2
    for name in ("tokens", "logprobs", "lengths", "finished", "expert_ids", "prompt_expert_ids"):
        np.testing.assert_array_equal(getattr(gen, name), np.asarray(getattr(ref, name))[:, :2] if "expert" in name
                                      else np.asarray(getattr(ref, name))[:2])
    routing = gen.prompt_routing(1, 2)
    assert routing.shape == (config.num_hidden_layers, 2, config.num_experts_per_tok) and (routing >= 0).all()
    assert (gen.prompt_expert_ids[:, 1, :6] == -1).all()   # left padding of the 2-token prompt: no routing


def test_waves_equal_one_call_token_for_token(params, config, tokenizer):
    """5 prompts in waves of 2 (the last wave filled up with its first prompt) sample, with the same key, exactly
    the tokens and routing of one call over all rows (log-probs to fp32 rounding); every wave runs at the
    batch's columns."""
    prompts = [[5, 6, 7, 8, 9], [11, 12], [13, 14, 15], [16], [17, 18, 19, 20]]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=5, stop_token_ids=(2,))
    rng = jax.random.key(7)
    one = JaxSampler(params, config, tokenizer, bucket=8).generate(prompts, sampling, rng, expert_ids=True)
    waves = JaxSampler(params, config, tokenizer, bucket=8, wave_rows=2).generate(prompts, sampling, rng,
                                                                                  expert_ids=True)
    assert one.batch_shape == (5, 8) and waves.batch_shape == (2, 8)
    for name in ("tokens", "lengths", "finished", "expert_ids", "prompt_expert_ids"):
        np.testing.assert_array_equal(getattr(waves, name), getattr(one, name), err_msg=name)
    # the batch size changes XLA's matmul blocking: log-probs agree to fp32 rounding (seen: 1 ulp)
    np.testing.assert_allclose(waves.logprobs, one.logprobs, rtol=1e-6, atol=0)
    assert len({tuple(r) for r in one.tokens}) > 1   # the rows drew different samples: the keys are per row


def test_a_wave_without_a_row_is_refused():
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="JaxSampler.wave_rows"):
            JaxSampler(None, None, None, wave_rows=bad)
    with pytest.raises(ValueError, match="RLConfig.rollout_wave_rows = 0"):
        RLConfig(rollout_wave_rows=0)


@dataclasses.dataclass(frozen=True)
class TextEngine:
    """An engine that knows nothing of JAX: token ids in, ids and log-probs out (as an inference server would)."""

    tokenizer: object
    model_config: object
    text_for: object
    bucket: int = 64

    def with_params(self, params):
        return self

    def generate(self, prompts, sampling, rng, *, rows=None, expert_ids=False):
        n = sampling.max_new_tokens
        outs = [self.tokenizer(self.text_for(self.tokenizer.decode(p, skip_special_tokens=False)),
                               add_special_tokens=False)["input_ids"][:n] for p in prompts]
        tokens = np.full((len(prompts), n), sampling.pad_token_id, np.int32)
        for r, out in enumerate(outs):
            tokens[r, :len(out)] = out
        lengths = np.asarray([len(o) for o in outs], np.int32)
        logprobs = np.where(np.arange(n)[None] < lengths[:, None], -1.0, 0.0).astype(np.float32)
        finished = np.asarray([o[-1] in sampling.stop_token_ids for o in outs])
        return Generation(tokens, logprobs, lengths, finished)


def test_an_engine_implementing_the_protocol_drives_rollouts(config, tokenizer, world, harness):
    tasks = sample_tasks(world, 2, seed=5)
    reply = lambda prompt: "查一下\n</think>\n\n宝宝，有货哦。<|im_end|>"  # noqa: E731
    settings = RolloutConfig(SamplingConfig(temperature=1.0, max_new_tokens=64), group_size=2, max_turns=2)
    jax_batch = rollout_episodes(JaxSampler(None, config, tokenizer, generate_fn=scripted(tokenizer, reply)), world,
                                 tasks, [harness] * 2, jax.random.key(0), settings)
    engine_batch = rollout_episodes(TextEngine(tokenizer, config, reply), world, tasks, [harness] * 2,
                                    jax.random.key(0), settings)
    for name in ("input_ids", "attention_mask", "action_mask", "old_logprobs", "group_ids", "truncated"):
        np.testing.assert_array_equal(getattr(engine_batch, name), getattr(jax_batch, name))
    assert engine_batch.episodes == jax_batch.episodes and engine_batch.turn_texts == jax_batch.turn_texts
    assert engine_batch.stats["generate_shapes"] == [] and jax_batch.stats["generate_shapes"]
