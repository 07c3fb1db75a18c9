"""Tests of hat_jax.model.sampler on the `micro` preset (fp32, CPU).

The random micro model's logits are nearly flat (std ~0.16); the lm_head kernel is scaled by 10 (logits up
to ~8) so that sampling is non-trivial. Measured on CPU: smallest greedy top-1/top-2 gap 1.5e-3, cached vs.
uncached logits differ by <= 5e-6, batched vs. alone logprobs by <= 3e-6. Compilations are shared through
module fixtures (one batch shape; stop ids, temperature and top_p values are traced, see sampler.py).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_cache, init_params
from hat_jax.model.sampler import generate, left_pad
from hat_jax.model.sampling import SamplingConfig, sample_tokens, top_k_mask, top_p_mask

N = 16                      # new tokens
LENGTHS = (66, 52, 9)       # rows 0 and 1 cross 64 tokens (one accelerator DeltaNet chunk, four CPU chunks): row 0 in prefill, row 1 while decoding


@pytest.fixture(scope="module")
def config():
    return get_config("micro")


@pytest.fixture(scope="module")
def params(config):
    p = init_params(config, jax.random.key(0))
    return {**p, "lm_head": {"kernel": p["lm_head"]["kernel"] * 10.0}}


@pytest.fixture(scope="module")
def rows(config):
    rs = np.random.RandomState(0)
    return [rs.randint(3, config.vocab_size, size=n).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def batch(rows):
    return left_pad(rows)


@pytest.fixture(scope="module")
def forward(config):
    """Uncached full forward: (params, ids [B, T], mask [B, T]) -> logits [B, T, V] float32."""
    model = Qwen3_5MoeForCausalLM(config)
    return jax.jit(lambda p, ids, mask: model.apply({"params": p}, ids, attention_mask=mask).logits)


def greedy(config, n=N, stop=None):
    """Two stop ids throughout, so that changing their values reuses one compilation."""
    stop = (config.eos_token_id, 1) if stop is None else stop
    return SamplingConfig(max_new_tokens=n, stop_token_ids=stop, pad_token_id=config.pad_token_id)


@pytest.fixture(scope="module")
def greedy_result(config, params, batch):
    result = generate(params, config, *batch, jax.random.key(0), greedy(config))
    assert not np.isin(np.asarray(result.tokens), (config.eos_token_id, 1)).any()  # no early stop below
    return result


def full_logits(forward, params, batch, tokens):
    """log_softmax-ready logits of the uncached forward over prompt + tokens at the positions that predict
    each generated token: [B, N, V]."""
    ids, mask = batch
    seq = np.concatenate([ids, np.asarray(tokens)], 1)
    seq_mask = np.concatenate([mask, np.ones(np.shape(tokens), bool)], 1)
    p = ids.shape[1]
    return forward(params, seq, seq_mask)[:, p - 1:-1]


def test_cached_greedy_equals_uncached_rerun(config, params, batch, forward, greedy_result):
    ids, mask = batch
    b, p = ids.shape
    seq = np.concatenate([ids, np.zeros((b, N), np.int32)], 1)
    seq_mask = np.concatenate([mask, np.zeros((b, N), bool)], 1)
    for j in range(N):  # the not-yet-generated slots are masked; causality makes them irrelevant
        logits = forward(params, seq, seq_mask)[:, p - 1 + j]
        seq[:, p + j] = np.asarray(jnp.argmax(logits, -1))
        seq_mask[:, p + j] = True
    np.testing.assert_array_equal(np.asarray(greedy_result.tokens), seq[:, p:])
    np.testing.assert_array_equal(greedy_result.lengths, [N] * b)
    np.testing.assert_array_equal(greedy_result.finished, [False] * b)


def test_logprobs_equal_uncached_log_softmax(params, batch, forward, greedy_result):
    logits = full_logits(forward, params, batch, greedy_result.tokens)
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits), greedy_result.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(greedy_result.logprobs, expected, atol=1e-5, rtol=0)


def test_batched_rows_equal_rows_alone_and_max_new_tokens(config, params, rows, greedy_result):
    # rows 1 and 2 are left-padded in the batch (row 0 is not); alone they have no padding.
    n = 12
    for r in (1, 2):
        alone = generate(params, config, *left_pad([rows[r]]), jax.random.key(0), greedy(config, n=n))
        assert alone.tokens.shape == (1, n)
        np.testing.assert_array_equal(alone.tokens[0], greedy_result.tokens[r, :n])
        np.testing.assert_allclose(alone.logprobs[0], greedy_result.logprobs[r, :n], atol=1e-5, rtol=0)
        assert int(alone.lengths[0]) == n and not bool(alone.finished[0])


def test_prefill_then_steps_logits_equal_uncached(config, params, batch, forward, greedy_result):
    model = Qwen3_5MoeForCausalLM(config)
    step = jax.jit(lambda p, ids, mask, cache: model.apply({"params": p}, ids, attention_mask=mask, cache=cache))
    ids, mask = batch
    b, p = ids.shape
    tokens = np.asarray(greedy_result.tokens)
    seq = np.concatenate([ids, tokens], 1)
    expected = forward(params, seq, np.concatenate([mask, np.ones_like(tokens, bool)], 1))
    out = step(params, ids, mask, init_cache(config, b, p + N))
    got = [out.logits]
    cache = out.cache
    for j in range(N - 1):
        out = step(params, tokens[:, j:j + 1], np.ones((b, 1), bool), cache)
        got.append(out.logits)
        cache = out.cache
    got = jnp.concatenate(got, 1)
    real = np.concatenate([mask, np.ones((b, N - 1), bool)], 1)
    np.testing.assert_allclose(got[real], expected[:, :-1][real], atol=1e-5, rtol=0)
    assert int(cache["index"]) == p + N - 1


def test_stop_tokens_lengths_and_padding(config, params, batch, greedy_result):
    tokens = np.asarray(greedy_result.tokens)
    k = next(j for j in range(2, N) if tokens[0, j] not in tokens[0, :j])  # a new token of row 0 at step k >= 2
    stop = (int(tokens[0, k]), int(tokens[2, 0]))  # row 0 stops at step k, row 2 at its first token
    result = generate(params, config, *batch, jax.random.key(0), greedy(config, stop=stop))
    if stop[1] not in tokens[0, :k]:
        assert int(result.lengths[0]) == k + 1 and bool(result.finished[0])
    assert int(result.lengths[2]) == 1 and bool(result.finished[2])
    for r in range(tokens.shape[0]):  # every row: cut at its first stop token in the unconstrained decode
        hits = np.flatnonzero(np.isin(tokens[r], stop))
        length = hits[0] + 1 if hits.size else N
        assert int(result.lengths[r]) == length and bool(result.finished[r]) == bool(hits.size)
        np.testing.assert_array_equal(result.tokens[r, :length], tokens[r, :length])
        np.testing.assert_array_equal(result.tokens[r, length:], config.pad_token_id)
        np.testing.assert_allclose(result.logprobs[r, :length], greedy_result.logprobs[r, :length], atol=1e-6)
        np.testing.assert_array_equal(result.logprobs[r, length:], 0.0)


def test_sampling_reproducible_and_logprobs_untruncated(config, params, batch, forward, greedy_result):
    sampling = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=N, stop_token_ids=(config.eos_token_id,))
    tiny_p = dataclasses.replace(sampling, top_p=1e-6)
    a = generate(params, config, *batch, jax.random.key(1), sampling)
    b = generate(params, config, *batch, jax.random.key(1), sampling)
    c = generate(params, config, *batch, jax.random.key(2), sampling)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(a.tokens, c.tokens)
    assert not np.array_equal(a.tokens, greedy_result.tokens)
    live = np.arange(N)[None, :] < np.asarray(a.lengths)[:, None]
    logits = full_logits(forward, params, batch, a.tokens)
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits / 0.7), a.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(a.logprobs[live], expected[live], atol=1e-5, rtol=0)
    # A tiny top_p keeps only the top token: greedy tokens (same compilation: top_p's value is traced).
    tiny = generate(params, config, *batch, jax.random.key(3), tiny_p)
    np.testing.assert_array_equal(tiny.tokens, greedy_result.tokens)


def test_top_k_mask_hand_case():
    logits = jnp.array([[1.0, 3.0, 2.0, 3.0, -1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(top_k_mask(logits, 2), [[0, 1, 0, 1, 0], [1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(top_k_mask(logits, 3), [[0, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(top_k_mask(logits[0], 1), [0, 1, 0, 0, 0])  # tie -> lower id


def test_top_p_mask_hand_case():
    logits = jnp.log(jnp.array([[0.1, 0.5, 0.15, 0.25], [0.25, 0.25, 0.25, 0.25]]))
    # row 0 sorted: 0.5 (id 1), 0.25 (id 3), 0.15 (id 2), 0.1 (id 0); cumulative 0.5, 0.75, 0.9, 1.0
    np.testing.assert_array_equal(top_p_mask(logits, 0.4), [[0, 1, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(top_p_mask(logits, 0.6), [[0, 1, 0, 1], [1, 1, 1, 0]])
    np.testing.assert_array_equal(top_p_mask(logits, 0.8), [[0, 1, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(top_p_mask(logits, 1.0), [[1, 1, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(top_p_mask(logits, 1e-9), [[0, 1, 0, 0], [1, 0, 0, 0]])
    masked = jnp.array([[0.0, -jnp.inf, 1.0, -jnp.inf]])  # entries removed by top-k are never kept
    np.testing.assert_array_equal(top_p_mask(masked, 1.0), [[1, 0, 1, 0]])


def test_sample_tokens_statistics():
    sample = jax.jit(sample_tokens, static_argnums=2)
    rows = 20000
    logits = jnp.tile(jnp.log(jnp.array([0.1, 0.5, 0.15, 0.25])), (rows, 1))
    cases = [  # (sampling, expected distribution)
        (SamplingConfig(temperature=1.0, max_new_tokens=1), [0.1, 0.5, 0.15, 0.25]),
        (SamplingConfig(temperature=1.0, top_k=2, max_new_tokens=1), [0, 2 / 3, 0, 1 / 3]),
        (SamplingConfig(temperature=1.0, top_p=0.8, max_new_tokens=1), [0, 0.5 / 0.9, 0.15 / 0.9, 0.25 / 0.9]),
        (SamplingConfig(temperature=0.5, max_new_tokens=1), np.array([0.01, 0.25, 0.0225, 0.0625]) / 0.345),
    ]
    for sampling, expected in cases:
        tokens, logprobs = sample(logits, jax.random.key(0), sampling)
        freq = np.bincount(np.asarray(tokens), minlength=4) / rows
        np.testing.assert_allclose(freq, expected, atol=0.015)
        scaled = jax.nn.log_softmax(logits[0] / sampling.temperature)
        np.testing.assert_allclose(logprobs, scaled[tokens], atol=1e-6)
    random_logits = jax.random.normal(jax.random.key(5), (64, 100))
    top1, _ = sample(random_logits, jax.random.key(1), SamplingConfig(temperature=2.0, top_k=1, max_new_tokens=1))
    np.testing.assert_array_equal(top1, jnp.argmax(random_logits, -1))


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-1.0), "temperature"), (dict(top_k=-2), "top_k"), (dict(temperature=1.0, top_p=0.0), "top_p"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    (dict(pad_token_id=-1), "pad_token_id"), (dict(top_k=5), "top_k"),
])
def test_sampling_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{"max_new_tokens": 4, **kwargs})


def test_generate_rejects_right_padding_and_out_of_vocab(config, params):
    ids = np.array([[5, 6, 0]], np.int32)
    with pytest.raises(ValueError, match="left padding"):
        generate(params, config, ids, np.array([[True, True, False]]), jax.random.key(0), greedy(config))
    with pytest.raises(ValueError, match="vocab_size"):
        generate(params, config, ids, np.ones((1, 3), bool), jax.random.key(0), greedy(config, stop=(10**6,)))
    with pytest.raises(ValueError, match="empty|at least one token"):
        left_pad([[1, 2], []])
