"""Token log-probs (hat_jax.rollout.logprobs): the alignment convention by hand, and the chunked form."""

import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.rollout.logprobs import chunk_plan, token_logprobs, token_logprobs_chunked


def test_token_logprobs_alignment():
    # logits [1, 3, 2]: position 0 predicts token 1, position 1 predicts token 2; position 2 is unused.
    logits = jnp.array([[[0.0, 0.0], [np.log(3.0), 0.0], [9.0, -9.0]]])
    ids = jnp.array([[1, 0, 0]])
    lp = token_logprobs(logits, ids)
    # entry 0 = 0; entry 1 = log 1/2 (uniform); entry 2 = log 3/(3+1) = log 0.75
    np.testing.assert_allclose(lp, [[0.0, np.log(0.5), np.log(0.75)]], rtol=1e-6)
    # temperature 2 halves the logits: entry 2 = log sqrt3/(sqrt3+1)
    lp2 = token_logprobs(logits, ids, temperature=2.0)
    np.testing.assert_allclose(lp2[0, 2], np.log(np.sqrt(3) / (np.sqrt(3) + 1)), rtol=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64])
def test_chunked_logprobs_equal_plain(chunk):
    """V = 11: most chunk sizes leave a last chunk shifted left over columns an earlier chunk owns."""
    rng = np.random.default_rng(0)
    hidden, kernel = jnp.asarray(rng.normal(size=(2, 5, 8))), jnp.asarray(2.0 * rng.normal(size=(8, 11)))
    ids = jnp.asarray(rng.integers(0, 11, size=(2, 5)))
    for temperature in (0.7, 1.0):
        np.testing.assert_allclose(token_logprobs_chunked(hidden, kernel, ids, chunk=chunk, temperature=temperature),
                                   token_logprobs(hidden @ kernel, ids, temperature=temperature), atol=2e-5)


def test_chunk_plan():
    assert chunk_plan(11, 4) == (4, 3) and chunk_plan(11, 64) == (11, 1) and chunk_plan(8, 8) == (8, 1)
    with pytest.raises(ValueError, match="positive vocabulary chunk size, got 0"):
        chunk_plan(11, 0)
