"""The `dense` expert dispatch (every expert on every token, then the k chosen gathered) equals `blocked`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from moe_helpers import expert_grads, expert_inputs

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.moe import blocked_expert_ffn, dense_expert_ffn
from hat_jax.model.sampler import generate, left_pad
from hat_jax.model.sampling import SamplingConfig


@pytest.mark.parametrize("n,e,k", [(1, 16, 4), (16, 8, 2), (300, 8, 2)])
def test_dense_dispatch_equals_blocked_values_and_gradients(n, e, k):
    inputs = expert_inputs(np.random.RandomState(n + e), n, e, k, h=6, i=5, scale=0.3)
    np.testing.assert_allclose(dense_expert_ffn(*inputs), blocked_expert_ffn(*inputs), atol=1e-6)
    for a, b in zip(expert_grads(dense_expert_ffn, *inputs), expert_grads(blocked_expert_ffn, *inputs)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_dense_model_forward_and_generate_equal_blocked():
    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    ids = jnp.asarray(np.random.RandomState(0).randint(3, config.vocab_size, (2, 40)), jnp.int32)
    out = {impl: jax.jit(lambda p, i, impl=impl: Qwen3_5MoeForCausalLM(config, moe_impl=impl).apply(
        {"params": p}, i))(params, ids) for impl in ("blocked", "dense")}
    np.testing.assert_allclose(out["dense"].logits, out["blocked"].logits, atol=1e-5)
    np.testing.assert_array_equal(out["dense"].expert_ids, out["blocked"].expert_ids)

    batch = left_pad([ids[0, :30].tolist(), ids[1, :17].tolist()])
    s = SamplingConfig(temperature=0.0, max_new_tokens=6)
    res = {impl: generate(params, config, *batch, jax.random.key(0), s, moe_impl=impl) for impl in ("blocked", "dense")}
    np.testing.assert_array_equal(res["dense"].tokens, res["blocked"].tokens)
    np.testing.assert_allclose(res["dense"].logprobs, res["blocked"].logprobs, atol=1e-5)
