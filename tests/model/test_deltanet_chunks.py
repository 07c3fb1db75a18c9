"""The chunked gated delta rule gives the same outputs, final state and gradients at every chunk size and in
checkpointed groups of chunks; the from-scratch dt_bias init."""

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from hat_jax.model.deltanet import CPU_CHUNK_SIZE, chunk_gated_delta_rule, default_chunk_size, default_group


def _inputs(b=2, t=77, h=3, dk=8, dv=5):
    r = np.random.RandomState(0)
    k = r.randn(b, t, h, dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    arrays = (r.randn(b, t, h, dk) * dk**-0.5, k, r.randn(b, t, h, dv), -np.log1p(np.exp(r.randn(b, t, h))),
              1 / (1 + np.exp(-r.randn(b, t, h))), r.randn(b, h, dk, dv) * 0.1)
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def test_chunk_sizes_agree_on_outputs_state_and_gradients():
    args = _inputs()

    def loss(c):
        def f(*a):
            out, state = chunk_gated_delta_rule(*a, chunk_size=c)
            return jnp.sum(jnp.sin(out)) + jnp.sum(state ** 2)
        return f

    # jitted: one compile per chunk size instead of op-by-op dispatch
    run = lambda c: jax.jit(lambda *a: chunk_gated_delta_rule(*a, chunk_size=c))  # noqa: E731
    grad = lambda c: jax.jit(jax.grad(loss(c), argnums=tuple(range(6))))  # noqa: E731
    ref_out, ref_state = run(64)(*args)
    ref_grads = grad(64)(*args)
    for c in (8, 16, 32):
        out, state = run(c)(*args)
        np.testing.assert_allclose(out, ref_out, atol=2e-5)
        np.testing.assert_allclose(state, ref_state, atol=2e-5)
        for g, e in zip(grad(c)(*args), ref_grads):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("with_resets", [False, True])
def test_checkpointed_groups_of_chunks_agree_on_outputs_state_and_gradients(with_resets):
    """77 tokens in chunks of 8 = 10 chunks; groups of 3 (padded to 12 chunks) and 16 (one padded group);
    documents starting at 0, 5, 8 (a chunk start), 30 and 76 (the last token) when with_resets."""
    args = _inputs()
    reset = None
    if with_resets:
        reset = jnp.zeros((2, 77), bool).at[:, [0, 5, 8, 30, 76]].set(True).at[1, 41].set(True)
    run = lambda group: lambda *a: chunk_gated_delta_rule(*a, chunk_size=8, reset=reset, group=group)
    loss = lambda group: lambda *a: jnp.sum(jnp.sin(run(group)(*a)[0])) + jnp.sum(run(group)(*a)[1] ** 2)
    ref_out, ref_state = run(None)(*args)
    ref_grads = jax.grad(loss(None), argnums=tuple(range(6)))(*args)
    for group in (3, 16):
        out, state = jax.jit(run(group))(*args)
        np.testing.assert_allclose(out, ref_out, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(state, ref_state, rtol=1e-6, atol=1e-6)
        for g, e in zip(jax.jit(jax.grad(loss(group), argnums=tuple(range(6))))(*args), ref_grads):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_groups_are_for_accelerators_and_long_sequences(monkeypatch):
    import hat_jax.model.deltanet as deltanet

    assert deltanet.target_platform() != "cpu" or default_group(256) is None
    monkeypatch.setattr(deltanet, "target_platform", lambda: "tpu")
    assert [default_group(n) for n in (8, 15, 16, 64, 255, 256, 1024)] == [None, None, 4, 8, 16, 16, 32]
    with pytest.raises(ValueError, match="group = 0: expected None or a positive number of chunks"):
        chunk_gated_delta_rule(*_inputs(), chunk_size=8, group=0)


def test_cpu_backend_uses_the_cpu_chunk_size():
    assert jax.default_backend() != "cpu" or default_chunk_size() == CPU_CHUNK_SIZE


def test_dt_bias_init_spans_the_gated_deltanet_authors_range():
    from hat_jax.model.deltanet import DT_MAX, DT_MIN, _dt_bias_init

    dt_bias = _dt_bias_init(jax.random.key(0), (4096,), jnp.float32)
    dt = np.asarray(jax.nn.softplus(dt_bias))  # softplus inverts the init: dt ~ logU(DT_MIN, DT_MAX)
    assert dt.min() >= DT_MIN * (1 - 1e-4) and dt.max() <= DT_MAX * (1 + 1e-4)
    log_dt = np.log(dt)  # log-uniform: mean and quartiles of U(log 1e-3, log 0.1)
    np.testing.assert_allclose(log_dt.mean(), np.log(1e-2), atol=0.05)
    np.testing.assert_allclose(np.percentile(log_dt, [25, 75]), [np.log(10**-2.5), np.log(10**-1.5)], atol=0.08)


def test_deltanet_out_proj_starts_at_zero_so_its_residual_branch_is_the_identity():
    import flax

    from hat_jax.model.config import get_config
    from hat_jax.model.params import init_params
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM

    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    flat = flax.traverse_util.flatten_dict(params)
    out_proj = {k: v for k, v in flat.items() if k[-2:] == ("out_proj", "kernel")}
    assert len(out_proj) == config.layer_types.count("linear_attention") == 3
    assert all(not np.any(np.asarray(v)) for v in out_proj.values())
    # Other linear layers keep N(0, initializer_range): the attention output projection is not zeroed.
    o_proj = np.asarray(params["model"]["layers_3"]["self_attn"]["o_proj"]["kernel"])
    np.testing.assert_allclose(o_proj.std(), config.initializer_range, rtol=0.1)
    # So at init a DeltaNet layer adds only its MoE block's output to the residual stream.
    ids = jnp.asarray(np.random.RandomState(0).randint(3, config.vocab_size, (2, 9)), jnp.int32)
    _, inter = Qwen3_5MoeForCausalLM(config).apply({"params": params}, ids, capture_intermediates=True,
                                                   mutable=["intermediates"])
    layer0 = inter["intermediates"]["model"]["layers_0"]
    np.testing.assert_array_equal(np.asarray(layer0["linear_attn"]["__call__"][0][0]), 0.0)
