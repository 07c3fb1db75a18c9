"""Packed rows (segment ids) compute exactly what their documents give run separately: the segment helpers
and validator, both Gated DeltaNet forms with resets, the conv, attention within segments, and the whole
model's logits, MTP logits, gradients and MoE load-balancing loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import (Qwen3_5MoeForCausalLM, check_segment_ids, get_config, init_cache, init_params,
                           segment_ends, segment_positions, segment_starts)
from hat_jax.model.attention import attention
from hat_jax.model.attention_impls import causal_gqa_attention
from hat_jax.model.deltanet import (causal_depthwise_conv, chunk_gated_delta_rule, default_chunk_size,
                                    recurrent_gated_delta_rule)
from hat_jax.model.moe import load_balancing_loss
from hat_jax.model.transformer import mtp_loss


def _pack(lengths, total, pad_before=()):
    """segment_ids [total] for documents of `lengths` in order (ids 1..n), `pad_before[i]` padding tokens
    before document i, padding at the end."""
    seg = []
    for i, n in enumerate(lengths):
        seg += [0] * (pad_before[i] if i < len(pad_before) else 0) + [i + 1] * n
    assert len(seg) <= total
    return np.array(seg + [0] * (total - len(seg)), np.int32)


# ---------------------------------------------------------------- segment helpers and validator


def test_segment_starts_ends_and_positions_hand_case():
    seg = jnp.array([[1, 1, 2, 2, 2, 0, 0], [0, 3, 3, 4, 0, 5, 5]], jnp.int32)
    np.testing.assert_array_equal(segment_starts(seg), [[1, 0, 1, 0, 0, 0, 0], [0, 1, 0, 1, 0, 1, 0]])
    np.testing.assert_array_equal(segment_ends(seg), [[0, 1, 0, 0, 1, 0, 0], [0, 0, 1, 1, 0, 0, 1]])
    np.testing.assert_array_equal(segment_positions(seg), [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 0, 0, 0, 1]])
    assert segment_positions(seg).dtype == jnp.int32 and segment_starts(seg).dtype == jnp.bool_


def test_check_segment_ids_accepts_padding_around_documents():
    seg = np.array([[1, 1, 2, 2, 2, 0, 0], [0, 3, 3, 4, 0, 5, 5]])
    check_segment_ids(seg, np.asarray(segment_positions(jnp.asarray(seg))))
    check_segment_ids(seg, [[0, 1, 0, 1, 2, 7, 7], [9, 0, 1, 0, 9, 0, 1]])  # padding positions are free


@pytest.mark.parametrize("seg,positions,match", [
    ([[1, 1, 2], [2, 1, 1]], None, "row 1: ids must be non-decreasing .* 2 at token 0 then 1 at token 1"),
    ([[1, 1, 0, 1]], None, "row 0: document 1 is interrupted by padding between tokens 1 and 3"),
    ([[1, -1]], None, "row 0: token 1 has id -1"),
    ([1, 1, 2], None, "segment_ids: expected a 2-D integer array"),
    ([[1.0, 2.0]], None, "segment_ids: expected a 2-D integer array"),
    ([[1, 1, 2, 2]], [[0, 1, 2, 3]], "positions row 0: token 2 .* has position 2; expected 0"),
    ([[1, 1, 2, 2]], [[0, 1, 0]], r"positions: expected an integer array of shape \(1, 4\)"),
    ([[1, 1, 2, 2]], [[0.0, 1.0, 0.0, 1.0]], r"positions: expected an integer array .* dtype float64"),
])
def test_check_segment_ids_names_the_field_and_row(seg, positions, match):
    with pytest.raises(ValueError, match=match):
        check_segment_ids(np.array(seg), positions)


# ---------------------------------------------------------------- Gated DeltaNet kernels and conv


def _delta_inputs(t, b=1, h=2, dk=4, dv=3, seed=0):
    r = np.random.RandomState(seed)
    k = r.randn(b, t, h, dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    arrays = (r.randn(b, t, h, dk) * dk**-0.5, k, r.randn(b, t, h, dv), -np.log1p(np.exp(r.randn(b, t, h))),
              1 / (1 + np.exp(-r.randn(b, t, h))))
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


CHUNK = 8  # explicit small chunk: lengths 1, C-1, C, C+1, placed so that documents cross chunk boundaries
_chunked = jax.jit(chunk_gated_delta_rule, static_argnums=6)   # (eager dispatch is slower than compiling)
_recurrent = jax.jit(recurrent_gated_delta_rule)


def test_delta_rule_with_resets_equals_documents_run_separately():
    """Both forms with resets, on two packed rows, against the same documents one per row (right-padded
    to C+1 with zero initial states: padding after a document does not reach its outputs)."""
    orders = [(CHUNK + 1, 1, CHUNK - 1, CHUNK), (CHUNK, CHUNK - 1, 1, CHUNK + 1)]
    t = 3 * CHUNK + 4
    seg = np.stack([_pack(lengths, t) for lengths in orders])
    reset = segment_starts(jnp.asarray(seg))
    args = _delta_inputs(t, b=2)
    s0 = jnp.zeros((2, 2, 4, 3), jnp.float32)
    docs = [np.flatnonzero(seg[row] == d) for row in range(2) for d in range(1, 5)]
    rows = np.repeat([0, 1], 4)
    gather = np.stack([np.pad(idx, (0, CHUNK + 1 - len(idx)), mode="edge") for idx in docs])  # [8, C+1]
    real = np.zeros((8, CHUNK + 1), bool)
    for i, idx in enumerate(docs):
        real[i, : len(idx)] = True

    def separate(*a):
        out, _ = chunk_gated_delta_rule(*(x[rows[:, None], gather] for x in a), jnp.zeros((8, 2, 4, 3)), CHUNK)
        packed = jnp.zeros((2, t) + out.shape[2:])
        return packed.at[rows[:, None], gather].add(jnp.where(real[..., None, None], out, 0))

    chunked = lambda *a: chunk_gated_delta_rule(*a, s0, CHUNK, reset)[0]
    recurrent = lambda *a: recurrent_gated_delta_rule(*a, s0, reset)[0]
    on_real = jnp.asarray(seg > 0)[..., None, None]
    # outputs and the gradients w.r.t. q, k, v, g, beta of a loss of the real tokens' outputs
    run = lambda fn: jax.jit(jax.value_and_grad(
        lambda *a: (lambda o: (jnp.sum(jnp.where(on_real, jnp.sin(3 * o), 0)), jnp.where(on_real, o, 0)))(fn(*a)),
        argnums=tuple(range(5)), has_aux=True))(*args)
    (_, ref), ref_grads = run(separate)
    for fn in (chunked, recurrent):
        (_, out), grads = run(fn)
        np.testing.assert_allclose(out, ref, atol=1e-6)
        for g, e in zip(grads, ref_grads):
            np.testing.assert_allclose(g, e, atol=1e-5)
    # the state after a row's last document (padding cut off) equals that document's own final state
    end = 3 * CHUNK + 1  # row 0: its last document (length C) ends there
    _, state = _chunked(*(a[:1, :end] for a in args), s0[:1], CHUNK, reset[:1, :end])
    _, ref_state = _chunked(*(a[:1, end - CHUNK:end] for a in args), s0[:1], CHUNK)
    np.testing.assert_allclose(state, ref_state, atol=1e-6)


def test_chunked_reset_drops_the_initial_state_only_from_the_reset_on():
    args = _delta_inputs(12)
    s0 = jnp.asarray(np.random.RandomState(1).randn(1, 2, 4, 3), jnp.float32)
    reset = jnp.zeros((1, 12), bool).at[0, 5].set(True)
    out, _ = _chunked(*args, s0, CHUNK, reset)
    head, _ = _chunked(*(a[:, :5] for a in args), s0, CHUNK)          # before the reset: from S_0
    tail, _ = _chunked(*(a[:, 5:] for a in args), jnp.zeros_like(s0), CHUNK)
    np.testing.assert_allclose(out, jnp.concatenate([head, tail], axis=1), atol=1e-6)
    np.testing.assert_allclose(_recurrent(*args, s0, reset)[0], out, atol=1e-6)


def test_conv_sees_only_its_own_segment():
    x = jnp.array([1.0, 2.0, 3.0, 4.0, 5.0])[None, :, None]
    kernel = jnp.array([[1.0], [10.0], [100.0]])            # y[t] = x[t-2] + 10 x[t-1] + 100 x[t]
    state = jnp.full((1, 2, 1), 7.0)                        # ignored with segment ids
    y, _ = causal_depthwise_conv(x, kernel, state, jnp.array([[1, 1, 2, 2, 2]]))
    np.testing.assert_array_equal(y[0, :, 0], [100.0, 210.0, 300.0, 430.0, 543.0])
    y_plain, _ = causal_depthwise_conv(x, kernel, jnp.zeros((1, 2, 1)))
    np.testing.assert_array_equal(y_plain[0, :, 0], [100.0, 210.0, 321.0, 432.0, 543.0])


# ---------------------------------------------------------------- attention


def _causal_attention_reference(q, k, v, scale):
    """numpy: one document's causal GQA attention. q [T, H, D], k, v [T, KV, D] -> [T, H, D]."""
    t, h, _ = q.shape
    kr, vr = (np.repeat(a, h // a.shape[1], axis=1) for a in (k, v))
    scores = np.einsum("thd,shd->hts", q, kr) * scale + np.where(np.tril(np.ones((t, t))), 0, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), vr)


def test_attention_stays_within_segments():
    lengths, t = (5, 1, 9), 18
    seg = np.stack([_pack(lengths, t), _pack(lengths[::-1], t, (2,))])
    r = np.random.RandomState(0)
    q, k, v = (r.randn(2, t, n, 4).astype(np.float32) for n in (4, 2, 2))
    ref = np.zeros((2, t, 4, 4), np.float32)
    for row in range(2):
        for doc in range(1, 4):
            idx = np.flatnonzero(seg[row] == doc)
            ref[row, idx] = _causal_attention_reference(q[row, idx], k[row, idx], v[row, idx], 0.5)
    real = seg[..., None, None] > 0
    q, k, v, seg = map(jnp.asarray, (q, k, v, seg))
    for fn in (lambda *a: attention(*a, scale=0.5),                                # causal blocks
               lambda *a: attention(*a, scale=0.5, q_offset=jnp.int32(0)),         # dense mask (traced offset)
               lambda *a: causal_gqa_attention(*a, 0.5, 0, block=4)):              # several query blocks
        out = jax.jit(fn)(q, k, v, seg, seg)
        np.testing.assert_allclose(np.where(real, out, 0), ref, atol=1e-6)
        assert np.all(np.isfinite(out))


# ---------------------------------------------------------------- the whole model


@pytest.fixture(scope="module")
def micro():
    config = get_config("micro")
    return config, init_params(config, jax.random.key(0))


def _model_case(config):
    """Two packed rows of documents of lengths 1, C-1, C, C+1 (C = the model's chunk size), crossing chunk
    boundaries, one with padding between documents; and the same documents one per row, right-padded."""
    c = default_chunk_size()
    orders = [((c + 1, 1, c - 1, c), ()), ((c, c - 1, 1, c + 1), (0, 2))]
    t = 4 * c + 4
    seg = np.stack([_pack(lengths, t, pads) for lengths, pads in orders])
    r = np.random.RandomState(0)
    ids = np.where(seg > 0, r.randint(3, config.vocab_size, seg.shape), 0).astype(np.int32)
    docs = [ids[row][seg[row] == d] for row in range(2) for d in range(1, 5)]
    width = max(map(len, docs))
    sep_ids = np.zeros((len(docs), width), np.int32)
    sep_mask = np.zeros((len(docs), width), bool)
    for i, d in enumerate(docs):
        sep_ids[i, : len(d)], sep_mask[i, : len(d)] = d, True
    targets = r.randint(0, config.vocab_size, seg.shape).astype(np.int32)
    sep_targets = np.zeros_like(sep_ids)
    for i, (row, d) in enumerate((row, d) for row in range(2) for d in range(1, 5)):
        sep_targets[i, : len(docs[i])] = targets[row][seg[row] == d]
    return seg, ids, targets, sep_ids, sep_mask, sep_targets


def _loss_and_grads(model, params, ids, targets, real, **kwargs):
    """A loss summed over real tokens of the logits and MTP logits; returns (loss, (out, grads))."""

    def loss(p):
        out = model.apply({"params": p}, ids, with_mtp=True, **kwargs)
        logp = jax.nn.log_softmax(out.logits, -1)
        mtp_logp = jax.nn.log_softmax(out.mtp_logits, -1)
        pick = lambda lp: jnp.take_along_axis(lp, targets[..., None], -1)[..., 0]
        return jnp.sum((pick(logp) + 0.5 * pick(mtp_logp)) * real), out

    (value, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, out, grads


def test_packed_rows_equal_their_documents_run_separately(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    seg, ids, targets, sep_ids, sep_mask, sep_targets = _model_case(config)
    check_segment_ids(seg)
    v_pack, pack, g_pack = _loss_and_grads(model, params, jnp.asarray(ids), jnp.asarray(targets), seg > 0,
                                           segment_ids=jnp.asarray(seg))
    v_sep, sep, g_sep = _loss_and_grads(model, params, jnp.asarray(sep_ids), jnp.asarray(sep_targets), sep_mask,
                                        attention_mask=jnp.asarray(sep_mask))
    real = seg > 0
    np.testing.assert_allclose(np.asarray(pack.logits)[real], np.asarray(sep.logits)[sep_mask], atol=1e-5)
    # MTP: at each document's last token the next-token input is the padding id, as at a row's end
    np.testing.assert_allclose(np.asarray(pack.mtp_logits)[real], np.asarray(sep.mtp_logits)[sep_mask], atol=1e-5)
    np.testing.assert_allclose(v_pack, v_sep, rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_pack), jax.tree_util.tree_leaves(g_sep)):
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=jax.tree_util.keystr(path))
    # MoE load balancing: with the token mask, padding rows drop out (same real tokens -> same loss)
    k = config.num_experts_per_tok
    lb_pack = load_balancing_loss(pack.router_logits, k, jnp.asarray(real.reshape(-1)))
    lb_sep = load_balancing_loss(sep.router_logits, k, jnp.asarray(sep_mask.reshape(-1)))
    np.testing.assert_allclose(lb_pack, lb_sep, rtol=1e-6)
    assert abs(float(load_balancing_loss(pack.router_logits, k)) - float(lb_pack)) > 1e-4


def test_packed_positions_default_to_per_document_positions(micro):
    """RoPE is relative, so wrong absolute positions would barely move the outputs: check the default
    positions themselves (bitwise the same logits as passing `segment_positions` explicitly)."""
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    seg = jnp.asarray(_pack((3, 2), 7)[None])
    ids = jnp.asarray([[5, 6, 7, 8, 9, 0, 0]], jnp.int32)
    fwd = jax.jit(lambda p, pos: model.apply({"params": p}, ids, positions=pos, segment_ids=seg, with_mtp=True))
    explicit = fwd(params, segment_positions(seg))
    default = jax.jit(lambda p: model.apply({"params": p}, ids, segment_ids=seg, with_mtp=True))(params)
    np.testing.assert_array_equal(default.logits, explicit.logits)
    np.testing.assert_array_equal(default.mtp_logits, explicit.mtp_logits)
    assert not np.allclose(fwd(params, jnp.arange(7)[None] * 1000).logits, explicit.logits, atol=1e-3)


def test_mtp_loss_counts_only_targets_in_the_same_document():
    logits = jnp.asarray(np.random.RandomState(0).randn(1, 6, 5), jnp.float32)
    ids = jnp.array([[1, 2, 3, 4, 0, 0]])
    seg = jnp.array([[1, 1, 1, 2, 2, 0]])
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits[:, :4], -1), ids[:, 2:, None], -1)[0, :, 0]
    # position 0 (target token 2, doc 1) counts; 1 (-> token 3, doc 2), 2 (-> doc 2), 3 (-> padding) do not
    np.testing.assert_allclose(mtp_loss(logits, ids, segment_ids=seg), nll[0], rtol=1e-6)


def test_segment_ids_refuse_an_attention_mask_or_a_cache(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    ids, seg = jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="segment_ids and attention_mask are exclusive"):
        model.apply({"params": params}, ids, attention_mask=jnp.ones((1, 4)), segment_ids=seg)
    with pytest.raises(ValueError, match="segment_ids with a cache is not supported"):
        model.apply({"params": params}, ids, cache=init_cache(config, 1, 8), segment_ids=seg)
    with pytest.raises(ValueError, match=r"segment_ids: expected an integer array of shape \(1, 4\)"):
        model.apply({"params": params}, ids, segment_ids=seg[:, :3])
