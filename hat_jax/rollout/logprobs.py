"""A policy's per-token log-probabilities under teacher forcing, plain and over vocabulary chunks.

Conventions (shared by the sampler's records and every stage that rescores them): sequences are [B, T]
right-padded; entry t of a per-token array refers to token t, which the logits at position t-1 predict; entry 0
is 0. Log-probs are taken at a sampling temperature: log_softmax(logits / temperature), the distribution the
sampler's `logprobs` are recorded under (`hat_jax.model.sampler`), as marin's `compute_logprobs`.

- `token_logprobs`: from materialised logits [B, T, V].
- `token_logprobs_chunked`: from the final hidden states and the lm_head kernel, streaming the vocabulary
  through a running logsumexp (`vocab_chunk_logits`, `running_logsumexp`) over the rows of `predicting_rows`
  (split over the mesh's batch axes), so [B, T, V] never exists; the chunk helpers are shared with the chunked
  cross-entropy, entropy and KL of `hat_jax.train`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hat_jax.model.sharding import constrain


def shift_pad(x: jax.Array) -> jax.Array:
    """[B, T-1] values for tokens 1..T-1 -> [B, T] with entry 0 = 0."""
    return jnp.pad(x, ((0, 0), (1, 0)))


def token_logprobs(logits: jax.Array, input_ids: jax.Array, temperature: float | jax.Array = 1.0) -> jax.Array:
    """Log-probability of each token under the distribution the previous position predicts.

    Args:
        logits: [B, T, V] any float dtype (computed in float32).
        input_ids: [B, T] int32.
        temperature: the sampler temperature (> 0); logits are divided by it (both policies'
            logprobs must use the sampling temperature, as marin's `compute_logprobs`; TRL #6789).
    Returns:
        [B, T] float32: entry 0 = 0, entry t = log_softmax(logits[:, t-1] / temperature)[input_ids[:, t]].
    """
    z = logits[:, :-1].astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(z, axis=-1)
    picked = jnp.take_along_axis(logp, input_ids[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
    return shift_pad(picked)


def predicting_rows(hidden: jax.Array) -> jax.Array:
    """[B, T, H] -> [B*T, H]: every position's hidden state as one row of the chunked vocabulary matmuls,
    the rows split over the mesh's batch axes (`constrain`). Position T-1 predicts nothing; callers drop it
    with `next_token_values`. All T positions are kept (not T-1) so that B*T divides by the batch devices
    whenever B*T does (T-1 = 16,383 is odd), at 1/T extra compute."""
    b, t, h = hidden.shape
    return constrain(hidden.reshape(b * t, h), ("tokens", None))


def next_token_values(rows: jax.Array, b: int, t: int) -> jax.Array:
    """[B*T] per-position values of `predicting_rows` -> [B, T]: entry 0 = 0, entry t = position t-1's value."""
    return shift_pad(rows.reshape(b, t)[:, :-1])


def chunk_plan(vocab: int, chunk: int) -> tuple[int, int]:
    """(chunk width, number of chunks) covering a vocabulary of `vocab` columns with chunks of at most `chunk`.

    Raises:
        ValueError: chunk < 1.
    """
    if int(chunk) < 1:
        raise ValueError(f"chunk: expected a positive vocabulary chunk size, got {chunk!r}")
    size = min(int(chunk), vocab)
    return size, -(-vocab // size)


def vocab_chunk_logits(x: jax.Array, kernel: jax.Array, i: jax.Array, size: int,
                       temperature, compute_dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Logits of vocabulary chunk i: columns [i*size, (i+1)*size) of `x @ kernel`, divided by temperature.

    The last chunk is shifted left to stay inside the vocabulary (no padded copy of the kernel), so
    some of its columns were already covered by chunk i-1: `fresh` marks the columns this chunk owns.

    Args:
        x: [M, H]; kernel: [H, V]; i: int32 scalar chunk index; size: static chunk width (<= V).
    Returns:
        (logits [M, size] float32, column ids [size] int32, fresh [size] bool).
    """
    vocab = kernel.shape[1]
    start = jnp.minimum(i * size, vocab - size)
    k = jax.lax.dynamic_slice_in_dim(kernel, start, size, axis=1)
    z = jnp.dot(x.astype(compute_dtype), k.astype(compute_dtype), preferred_element_type=jnp.float32)
    cols = start + jnp.arange(size, dtype=jnp.int32)
    return z / temperature, cols, cols >= i * size


def running_logsumexp(m: jax.Array, s: jax.Array, z: jax.Array, fresh: jax.Array):
    """One step of a streaming logsumexp over the last axis: lse = m + log(s).

    m is held out of the gradient (lse does not depend on the shift), so the gradient of the final
    m + log(s) is exactly softmax(z) over all chunks.

    Args:
        m: [M] running max (init -inf); s: [M] running sum of exp(z - m) (init 0);
        z: [M, C] this chunk's logits; fresh: [C] columns to include.
    Returns:
        (m_new [M], s_new [M], exp(z - m_new) [M, C] with non-fresh columns 0, scale exp(m - m_new) [M]).
    """
    z = jnp.where(fresh[None, :], z, -jnp.inf)
    m_new = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(z, axis=-1)))
    scale = jnp.exp(m - m_new)
    e = jnp.exp(z - m_new[:, None])
    return m_new, s * scale + jnp.sum(e, axis=-1), e, scale


def token_logprobs_chunked(hidden: jax.Array, lm_head_kernel: jax.Array, input_ids: jax.Array,
                           chunk: int = 8192, temperature: float | jax.Array = 1.0,
                           compute_dtype=jnp.float32) -> jax.Array:
    """`token_logprobs(hidden @ lm_head_kernel, input_ids)` without materialising [B, T, V].

    A `jax.lax.scan` over vocabulary chunks keeps a running logsumexp and picks the target logit out
    of the chunk that holds it; the scan body is rematerialised (`jax.checkpoint`) so the backward
    pass also holds one [B*T, chunk] block at a time.

    Args:
        hidden: [B, T, H] the model's final (post-norm) hidden states.
        lm_head_kernel: [H, V] (the `lm_head/kernel` param).
        input_ids: [B, T] int32.
        chunk: vocabulary chunk width (any V; clipped to V).
        temperature: sampler temperature.
        compute_dtype: matmul input dtype (accumulation is float32).
    Returns:
        [B, T] float32, same convention as `token_logprobs`.
    """
    b, t, _ = hidden.shape
    size, n_chunks = chunk_plan(lm_head_kernel.shape[1], chunk)
    x = predicting_rows(hidden)
    target = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1))).reshape(-1).astype(jnp.int32)

    def body(carry, i):
        m, s, picked = carry
        z, cols, fresh = vocab_chunk_logits(x, lm_head_kernel, i, size, temperature, compute_dtype)
        m, s, _, _ = running_logsumexp(m, s, z, fresh)
        hit = (cols[None, :] == target[:, None]) & fresh[None, :]
        return (m, s, picked + jnp.sum(jnp.where(hit, z, 0.0), axis=-1)), None

    rows = x.shape[0]
    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32), jnp.zeros((rows,), jnp.float32))
    (m, s, picked), _ = jax.lax.scan(jax.checkpoint(body, prevent_cse=False), init, jnp.arange(n_chunks))
    return next_token_values(picked - (m + jnp.log(s)), b, t)


def greedy_tokens_chunked(hidden: jax.Array, kernel: jax.Array, chunk: int, compute_dtype=jnp.float32) -> jax.Array:
    """`argmax(hidden @ kernel, -1)` over vocabulary chunks (`vocab_chunk_logits`), never holding [B, T, V].

    A `jax.lax.scan` over the chunks keeps the running maximum and its column, replaced only by a strictly
    larger value (columns a shifted last chunk repeats are excluded), so ties resolve to the lowest id as in
    `jnp.argmax`; each chunk's logits are the full matmul's dot products, so the tokens are the same.

    Args:
        hidden: [B, T, H]. kernel: [H, V] (the lm_head). chunk: columns per chunk (>= 1; clipped to V).
        compute_dtype: the matmul dtype (accumulation float32).
    Returns:
        [B, T] int32 token ids.
    Raises:
        ValueError: chunk < 1.
    """
    if chunk < 1:
        raise ValueError(f"greedy_tokens_chunked: chunk = {chunk}; expected >= 1")
    b, t, _ = hidden.shape
    size, n_chunks = chunk_plan(kernel.shape[1], chunk)
    x = predicting_rows(hidden)

    def body(carry, i):
        best, arg = carry
        z, cols, fresh = vocab_chunk_logits(x, kernel, i, size, 1.0, compute_dtype)
        z = jnp.where(fresh[None, :], z, -jnp.inf)
        top, idx = jnp.max(z, axis=-1), cols[jnp.argmax(z, axis=-1)]
        better = top > best
        return (jnp.where(better, top, best), jnp.where(better, idx, arg)), None

    rows = x.shape[0]
    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.int32))
    (_, arg), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
    return arg.reshape(b, t)
