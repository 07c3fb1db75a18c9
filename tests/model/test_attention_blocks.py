"""`causal_gqa_attention` (query blocks that skip the masked upper triangle) equals `gqa_attention`; the
segment mask equals the plain causal + padding mask for unpacked rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_cache, init_params
from hat_jax.model.attention_impls import causal_gqa_attention, gqa_attention


def _inputs(seed, b, t, s, h, kv, d):
    r = np.random.RandomState(seed)
    return (jnp.asarray(r.randn(b, t, h, d), jnp.float32), jnp.asarray(r.randn(b, s, kv, d), jnp.float32),
            jnp.asarray(r.randn(b, s, kv, d), jnp.float32))


def _causal_mask(b, t, s, offset, key_valid):
    slots = offset + np.arange(t)
    mask = np.arange(s)[None, None, :] <= slots[None, :, None]
    return jnp.asarray(mask & key_valid[:, None, :])


@pytest.mark.parametrize("offset,s,block", [(0, 37, 8), (0, 37, 64), (5, 50, 8), (0, 40, 16)])
def test_causal_blocks_equal_dense_with_left_and_right_padding(offset, s, block):
    b, t, h, kv, d = 3, 37, 4, 2, 8
    q, k, v = _inputs(0, b, t, s, h, kv, d)
    valid = np.ones((b, s), bool)
    valid[1, : offset + 6] = False            # left padding: the first queries of row 1 see no real key
    valid[2, offset + 30: offset + t] = False  # right padding
    valid[:, offset + t:] = False             # unwritten cache slots
    mask = _causal_mask(b, t, s, offset, valid)
    q_seg, kv_seg = jnp.ones((b, t), jnp.int32), jnp.asarray(valid, jnp.int32)
    ref = gqa_attention(q, k, v, mask, d**-0.5)
    out = causal_gqa_attention(q, k, v, q_seg, kv_seg, d**-0.5, offset, block)
    np.testing.assert_allclose(out, ref, atol=2e-6)  # fully masked rows included (uniform over all S)

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)))

    g_ref = jax.grad(loss(lambda q, k, v: gqa_attention(q, k, v, mask, d**-0.5)), argnums=(0, 1, 2))(q, k, v)
    g_out = jax.grad(loss(lambda q, k, v: causal_gqa_attention(q, k, v, q_seg, kv_seg, d**-0.5, offset, block)),
                     argnums=(0, 1, 2))(q, k, v)
    for a, e in zip(g_out, g_ref):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


def test_causal_blocks_reject_too_few_keys():
    q, k, v = _inputs(0, 1, 8, 8, 2, 1, 4)
    with pytest.raises(ValueError, match="exceeds"):
        causal_gqa_attention(q, k, v, jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32), 0.5, offset=1)


def test_prefill_with_a_static_cache_index_equals_a_traced_one():
    """A cache whose `index` is the Python int 0 (the sampler's prefill) gives the logits and cache of the
    same call with an int32 array index (the dense path)."""
    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    model = Qwen3_5MoeForCausalLM(config)
    r = np.random.RandomState(1)
    ids = jnp.asarray(r.randint(3, config.vocab_size, (2, 70)), jnp.int32)
    mask = jnp.asarray(np.arange(70)[None] >= np.array([[0], [9]]))   # row 1 left-padded
    run = lambda static: jax.jit(lambda p, i, m: model.apply(
        {"params": p}, i, attention_mask=m,
        cache={**init_cache(config, 2, 80), "index": 0} if static else init_cache(config, 2, 80)))(params, ids, mask)
    a, b = run(True), run(False)
    np.testing.assert_allclose(a.logits, b.logits, atol=2e-5)
    assert int(a.cache["index"]) == 70 and a.cache["index"].dtype == jnp.int32
    for x, y in zip(jax.tree_util.tree_leaves(a.cache), jax.tree_util.tree_leaves(b.cache)):
        np.testing.assert_allclose(x, y, atol=2e-5)


def test_single_query_attention_equals_the_heads_major_path():
    """T = 1 (a decode step) takes the multiply-and-reduce path; it equals row t of a T = 2 call."""
    b, s, h, kv, d = 3, 11, 4, 2, 8
    q, k, v = _inputs(3, b, 2, s, h, kv, d)
    valid = np.ones((b, s), bool)
    valid[1, :4] = False
    valid[2, :] = False                       # a fully masked row: uniform over all S
    mask = jnp.asarray(np.broadcast_to(valid[:, None, :], (b, 2, s)))
    both = gqa_attention(q, k, v, mask, d**-0.5)
    for t in range(2):
        one = gqa_attention(q[:, t:t + 1], k, v, mask[:, t:t + 1], d**-0.5)
        np.testing.assert_allclose(one[:, 0], both[:, t], atol=2e-6)
