"""The `megablox` expert dispatch (jax's Pallas TPU grouped matmul, run here in interpret mode) equals
`blocked`: values and gradients, with row counts that are and are not multiples of the row tile."""

import numpy as np
import pytest
from moe_helpers import expert_grads, expert_inputs

from hat_jax.model.moe import MEGABLOX_TILING, blocked_expert_ffn, megablox_expert_ffn


@pytest.mark.parametrize("n,e,k", [(1, 16, 4), (300, 8, 2)])
def test_megablox_dispatch_equals_blocked_values_and_gradients(n, e, k):
    assert (n * k) % MEGABLOX_TILING[0] != 0  # padded to the row tile (the tile-aligned case: test_sharding.py)
    inputs = expert_inputs(np.random.RandomState(n + e), n, e, k, h=6, i=5, scale=0.3)
    np.testing.assert_allclose(megablox_expert_ffn(*inputs), blocked_expert_ffn(*inputs), atol=1e-6)
    for a, b in zip(expert_grads(megablox_expert_ffn, *inputs), expert_grads(blocked_expert_ffn, *inputs)):
        np.testing.assert_allclose(a, b, atol=1e-5)
