"""Attention implementations against the XLA reference (`hat_jax.model.attention.attention`, impl 'xla').

Splash runs in Pallas interpret mode on CPU (micro shapes: interpret mode is slow); cuDNN cannot run here,
its argument mapping is checked through `jax.nn.dot_product_attention(implementation="xla")`.
Tolerances: float32, 1e-5 absolute on outputs and gradients (measured max |diff| ~1e-7).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model.attention import attention, resolve_attention_impl
from hat_jax.model.attention_impls import cudnn_attention, splash_attention, splash_block

TOL = 1e-5


def _qkv(b, t, h, kv, d, seed=0):
    kq, kk, kvv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (b, t, h, d), jnp.float32), jax.random.normal(kk, (b, t, kv, d), jnp.float32),
            jax.random.normal(kvv, (b, t, kv, d), jnp.float32))


def _packed_ids(t):
    """Row 0: three documents then padding; row 1: left padding then one document (unpacked form)."""
    row0 = np.zeros(t, np.int32)
    row0[:40], row0[40:100], row0[100:t - 20] = 1, 2, 3   # t >= 128
    kv1 = np.ones(t, np.int32)
    kv1[:30] = 0
    q = jnp.asarray(np.stack([row0, np.ones(t, np.int32)]))
    kvs = jnp.asarray(np.stack([row0, kv1]))
    return q, kvs


def _ref(q, k, v, qs, kvs, scale, causal=True):
    return attention(q, k, v, qs, kvs, scale=scale, causal=causal, impl="xla")


def _splash_and_ref(t, block, h=4, kv=2, d=8, causal=True, seed=0):
    q, k, v = _qkv(2, t, h, kv, d, seed)
    qs, kvs = _packed_ids(t)
    scale = d ** -0.5
    splash = lambda q, k, v: splash_attention(q, k, v, qs, kvs, scale=scale, causal=causal, block=block,
                                              interpret=True)
    ref = lambda q, k, v: _ref(q, k, v, qs, kvs, scale, causal)
    return (q, k, v), splash, ref


def test_splash_interpret_matches_reference_forward_and_grads():
    """T 256 in two blocks of 128, GQA (2 query heads per KV head), packed row + left-padded row."""
    args, splash, ref = _splash_and_ref(256, 128)
    out, want = jax.jit(splash)(*args), jax.jit(ref)(*args)
    assert not np.isnan(np.asarray(out)).any()
    np.testing.assert_allclose(out, want, atol=TOL, rtol=0)
    w = jax.random.normal(jax.random.key(1), out.shape)
    loss = lambda f: (lambda q, k, v: jnp.sum(f(q, k, v) * w))
    g = jax.jit(jax.grad(loss(splash), argnums=(0, 1, 2)))(*args)
    g_ref = jax.jit(jax.grad(loss(ref), argnums=(0, 1, 2)))(*args)
    for a, e in zip(g, g_ref):
        np.testing.assert_allclose(a, e, atol=TOL, rtol=0)


def test_splash_pads_t_to_the_block():
    """T 200 is padded to 256 inside and cut back."""
    args, splash, ref = _splash_and_ref(200, 128, seed=4)
    np.testing.assert_allclose(jax.jit(splash)(*args), jax.jit(ref)(*args), atol=TOL, rtol=0)


def test_splash_non_causal_matches_reference():
    args, splash, ref = _splash_and_ref(128, 128, h=2, kv=1, causal=False, seed=2)   # MQA
    np.testing.assert_allclose(jax.jit(splash)(*args), jax.jit(ref)(*args), atol=TOL, rtol=0)


def test_splash_block_sizes():
    assert splash_block(16384) == 512 and splash_block(512) == 512
    assert splash_block(200) == 256 and splash_block(64) == 128
    q, k, v = _qkv(1, 128, 2, 1, 8)
    ids = jnp.ones((1, 128), jnp.int32)
    with pytest.raises(ValueError, match="multiple of 128"):
        splash_attention(q, k, v, ids, ids, scale=1.0, block=96, interpret=True)
    with pytest.raises(ValueError, match="S == T"):
        splash_attention(q, k[:, :64], v[:, :64], ids, ids[:, :64], scale=1.0, interpret=True)


def test_cudnn_argument_mapping_with_xla_implementation():
    """Unpacked right-padded rows: `cudnn_attention`'s lengths + causal equal the segment-id reference."""
    b, t, h, kv, d = 3, 64, 4, 2, 16
    q, k, v = _qkv(b, t, h, kv, d, seed=3)
    lengths = np.array([64, 40, 0])                 # full, right-padded, all padding
    kvs = jnp.asarray((np.arange(t)[None, :] < lengths[:, None]).astype(np.int32))
    qs = jnp.ones((b, t), jnp.int32)
    out = cudnn_attention(q, k, v, qs, kvs, scale=0.25, packed=False, implementation="xla")
    np.testing.assert_allclose(out, _ref(q, k, v, qs, kvs, 0.25), atol=TOL, rtol=0)


def test_cudnn_refuses_packed_and_poisons_left_padding():
    q, k, v = _qkv(2, 32, 2, 1, 8)
    ids = jnp.ones((2, 32), jnp.int32)
    with pytest.raises(ValueError, match="attention_impl 'cudnn': packed rows"):
        cudnn_attention(q, k, v, ids, ids, scale=1.0, packed=True, implementation="xla")
    left = ids.at[1, :4].set(0)                     # row 1 left-padded: not expressible by lengths
    out = cudnn_attention(q, k, v, ids, left, scale=1.0, packed=False, implementation="xla")
    assert not np.isnan(np.asarray(out[0])).any() and np.isnan(np.asarray(out[1, 4:])).all()


def test_resolve_attention_impl():
    assert resolve_attention_impl("auto", "tpu") == "splash"
    assert resolve_attention_impl("auto", "gpu") == "cudnn"
    assert resolve_attention_impl("auto", "cpu") == "xla"
    assert resolve_attention_impl("auto") == "xla"  # this machine
    with pytest.raises(ValueError, match="attention_impl 'splash': needs a TPU"):
        resolve_attention_impl("splash", "cpu")
    with pytest.raises(ValueError, match="attention_impl 'cudnn': needs a GPU"):
        resolve_attention_impl("cudnn", "cpu")
    with pytest.raises(ValueError, match="attention_impl 'flash'"):
        resolve_attention_impl("flash")


def test_model_attention_impl_auto_is_the_xla_path_on_cpu():
    """`attention_impl` reaches the layers: 'auto' on CPU is bit-identical to 'xla'; 'splash' is refused."""
    from hat_jax.model.config import get_config
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM

    config = get_config("micro")
    ids = jax.random.randint(jax.random.key(0), (1, 16), 0, config.vocab_size)
    params = jax.jit(Qwen3_5MoeForCausalLM(config).init)(jax.random.key(1), ids)
    logits = lambda impl: jax.jit(lambda p, i: Qwen3_5MoeForCausalLM(config, attention_impl=impl).apply(p, i).logits)
    np.testing.assert_array_equal(logits("xla")(params, ids), logits("auto")(params, ids))
    with pytest.raises(ValueError, match="attention_impl 'splash': needs a TPU"):
        jax.eval_shape(logits("splash"), params, ids)


def test_has_key_matches_the_segment_mask():
    """`_has_key` (sort-based, no [T, S] mask) equals any() over `segment_mask`, causal and not."""
    from hat_jax.model.attention_impls import _has_key, segment_mask

    rng = np.random.default_rng(0)
    kvs = jnp.asarray(rng.integers(0, 4, (6, 50)), jnp.int32)
    qs = jnp.asarray(np.where(rng.random((6, 50)) < 0.5, np.asarray(kvs), rng.integers(0, 5, (6, 50))), jnp.int32)
    for causal in (True, False):
        np.testing.assert_array_equal(_has_key(qs, kvs, causal), jnp.any(segment_mask(qs, kvs, causal), axis=-1))
