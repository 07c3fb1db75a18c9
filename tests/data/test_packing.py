"""The packer (hat_jax.data.packing) and the cross-document loss mask (hat_jax.train.losses), by hand."""

import json
import math

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.data import packing as K
from hat_jax.rollout.logprobs import token_logprobs
from hat_jax.train.losses import masked_token_ce_sum, masked_token_ce_sum_chunked, same_document_targets

LENGTHS = (3, 5, 2, 4, 6, 1, 3)


def docs(lengths=LENGTHS, seq_len=8):
    """Document i: ids 100 i + 1 .. 100 i + n, loss on every token but the first."""
    return [K.fit_document(100 * i + np.arange(1, n + 1), np.r_[0, np.ones(n - 1)], seq_len, name=f"doc {i}")
            for i, n in enumerate(lengths)]


def rows(lengths=LENGTHS, seq_len=8, bins=2):
    source = grain.MapDataset.source(docs(lengths, seq_len)).to_iter_dataset()
    return list(K.pack_documents(source, seq_len, bins=bins, pad_id=-1, sum_features=("truncated",)))


def test_first_fit_rows_by_hand():
    # 2 open rows of 8: docs 0 (3) and 1 (5) fill row 0, docs 2 (2) and 3 (4) row 1; doc 4 (6) fits neither, so
    # both rows are emitted and doc 4 opens the next pair with doc 5 (1) beside it; doc 6 (3) goes to row 1.
    got = rows()
    assert [r["segment_ids"].tolist() for r in got] == [
        [1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 2, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 2, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    assert got[0]["input_ids"].tolist() == [1, 2, 3, 101, 102, 103, 104, 105]
    assert got[1]["input_ids"].tolist() == [201, 202, 301, 302, 303, 304, -1, -1]
    assert got[2]["positions"].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]
    assert got[1]["positions"].tolist() == [0, 1, 0, 1, 2, 3, 0, 0]
    # loss never on a document's first token (its target would come from the previous document) nor on padding
    assert got[1]["loss_mask"].tolist() == [0, 1, 0, 1, 1, 1, 0, 0]
    assert [int(r["documents"]) for r in got] == [2, 2, 2, 1] and sum(int(r["documents"]) for r in got) == 7
    assert all(r[k].dtype == np.int32 for r in got for k in K.ROW_KEYS)


def test_loss_on_a_first_token_is_dropped_by_the_packer():
    # A document whose loss mask marks its first token (SFT masks never do; the packer enforces it).
    doc = K.fit_document([7, 8, 9], [1, 1, 1], 8)
    source = grain.MapDataset.source([doc, doc]).to_iter_dataset()
    (row,) = list(K.pack_documents(source, 8, bins=1, pad_id=0))
    assert row["loss_mask"].tolist() == [0, 1, 1, 0, 1, 1, 0, 0]


def test_long_documents_are_truncated_and_counted_or_refused():
    doc = K.fit_document(np.arange(1, 12), np.ones(11), 8, name="chat 3")
    assert doc["input_ids"].tolist() == list(range(1, 9)) and int(doc["truncated"]) == 1 and int(doc["num_tokens"]) == 11
    got = rows((3, 11, 2), seq_len=8, bins=2)  # the 11-token document is cut to 8 and fills a row alone
    assert [int(r["truncated"]) for r in got] == [0, 1] and [int(r["documents"]) for r in got] == [2, 1]
    with pytest.raises(ValueError, match=r"document chat 3: 11 tokens > seq_len 8 and truncation is off"):
        K.fit_document(np.arange(1, 12), np.ones(11), 8, truncate=False, name="chat 3")
    with pytest.raises(ValueError, match="document x: expected non-empty 1-D"):
        K.fit_document([], [], 8, name="x")


def _stream(seq_len=8, bins=3, batch=2, geometry=None):
    lengths = [1 + (7 * i) % 8 for i in range(40)]
    source = grain.MapDataset.source(docs(lengths, seq_len)).to_iter_dataset()
    packed = K.pack_documents(source, seq_len, bins=bins, pad_id=0, sum_features=("truncated",))
    return K.PackedBatches(iter(packed.batch(batch, drop_remainder=True)), "test", geometry)


def test_resume_mid_pack_group_yields_the_same_batches_and_counts():
    full = list(_stream())
    for k in (1, 2, 3, 5):  # 3 open rows, batches of 2: states land at row 0, 1 and 2 of a packed group
        stream = _stream()
        for _ in range(k):
            next(stream)
        state = json.loads(json.dumps(stream.get_state()))  # checkpoints store it as JSON
        assert state["format"] == K.PACKED_FORMAT and state["batches"] == k
        assert state["tokens"] == sum(int(np.count_nonzero(b["segment_ids"])) for b in full[:k])
        assert state["documents"] == sum(int(b["documents"].sum()) for b in full[:k])
        resumed = _stream()
        resumed.set_state(state)
        rest = list(resumed)
        assert len(rest) == len(full) - k
        for a, b in zip(full[k:], rest, strict=True):
            assert all(np.array_equal(a[key], b[key]) for key in a)
        assert resumed.documents == stream.documents + sum(int(b["documents"].sum()) for b in rest)


def test_a_state_of_the_unpacked_pipeline_is_refused():
    stream = _stream()
    for old in ({"next_index": 4}, {"batches": 3, "tokens": 90, "truncated_rows": 0}):  # SFT's and pretraining's
        with pytest.raises(K.DataStateFormatError, match=r"format None .*this pipeline packs documents "
                                                         r"\(format 'packed-v1'\).*unpacked pipeline"):
            stream.set_state(old)
    with pytest.raises(ValueError, match="'tokens' must be an int >= 0"):
        stream.set_state({"format": K.PACKED_FORMAT, "pipeline": {}, "batches": 0, "documents": 0,
                          "truncated_documents": 0})


def test_a_state_of_other_packer_settings_is_refused_naming_the_field():
    stream = _stream(geometry={"data.seq_len": 8, "data.pack_bins": 3})
    next(stream)
    state = json.loads(json.dumps(stream.get_state()))
    assert state["geometry"] == {"data.seq_len": 8, "data.pack_bins": 3}
    fewer = _stream(bins=2, geometry={"data.seq_len": 8, "data.pack_bins": 2})
    with pytest.raises(K.DataStateFormatError, match=r"test data state: the checkpoint's packer ran with other "
                                                     r"settings \(data.pack_bins was 3, now 2\)"):
        fewer.set_state(state)
    assert fewer.batches == 0  # nothing was restored
    same = _stream(geometry={"data.seq_len": 8, "data.pack_bins": 3})
    same.set_state(state)
    assert same.batches == 1
    old = {k: v for k, v in state.items() if k != "geometry"}  # written before the geometry was recorded
    unchecked = _stream(geometry={"data.seq_len": 8, "data.pack_bins": 3})
    unchecked.set_state(old)
    assert unchecked.batches == 1


def test_bad_packed_batches_name_the_row():
    good = {"segment_ids": np.array([[1, 1, 2, 0], [1, 2, 2, 2]]), "positions": np.array([[0, 1, 0, 0], [0, 0, 1, 2]]),
            "loss_mask": np.array([[0, 1, 0, 0], [0, 0, 1, 1]])}
    K.check_packed_batch(good)
    cases = [
        ({"segment_ids": [[1, 1, 2, 0], [2, 1, 1, 1]]}, "batch 7: segment_ids row 1: ids must be non-decreasing"),
        ({"segment_ids": [[0, 1, 2, 2], [1, 2, 2, 2]], "positions": [[0, 0, 0, 1], [0, 0, 1, 2]],
          "loss_mask": [[0, 0, 0, 1], [0, 0, 1, 1]]}, "batch 7: segment_ids row 0: a document starts at t = 1 after "
                                                      "padding"),
        ({"positions": [[0, 1, 0, 0], [0, 1, 1, 2]]}, r"batch 7: positions row 1: token 1 .* expected 0"),
        ({"loss_mask": [[0, 1, 1, 0], [0, 0, 1, 1]]}, "batch 7: row 0 has loss_mask 1 at t = 2, .* first token"),
        ({"loss_mask": [[0, 1, 0, 1], [0, 0, 1, 1]]}, "batch 7: row 0 has loss_mask 1 at t = 3, a padding token"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            K.check_packed_batch({**good, **{k: np.array(v) for k, v in change.items()}}, "batch 7")

# ---------------------------------------------------------------------------------------------- losses

def test_same_document_targets_by_hand():
    seg = jnp.array([[1, 1, 1, 2, 2, 0], [1, 2, 3, 3, 0, 0]])
    assert same_document_targets(seg).astype(int).tolist() == [[0, 1, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0]]


def test_packed_ce_never_counts_a_cross_document_target():
    # Uniform logits over V = 8: every counted target costs ln 8. The mask marks every real token (first tokens
    # included, as a careless caller might): only the 3 within-document targets (t = 1, 2 and 4) count.
    seg = jnp.array([[1, 1, 1, 2, 2, 0]])
    ids = jnp.array([[5, 6, 7, 1, 2, 0]])
    ce, n = masked_token_ce_sum(jnp.zeros((1, 6, 8)), ids, (seg > 0).astype(jnp.int32), seg)
    assert float(n) == 3 and math.isclose(float(ce), 3 * math.log(8), rel_tol=1e-6)
    # Random logits: the packed CE is the sum over positions inside documents, and the chunked form agrees.
    key = jax.random.key(0)
    hidden, kernel = jax.random.normal(key, (1, 6, 4)), jax.random.normal(jax.random.fold_in(key, 1), (4, 8))
    mask = jnp.ones((1, 6), jnp.int32)
    ce, n = masked_token_ce_sum(hidden @ kernel, ids, mask, seg)
    lp = token_logprobs(hidden @ kernel, ids)
    assert float(n) == 3 and math.isclose(float(ce), -float(lp[0, 1] + lp[0, 2] + lp[0, 4]), rel_tol=1e-6)
    ce_c, n_c = masked_token_ce_sum_chunked(hidden, kernel, ids, mask, chunk=3, segment_ids=seg)
    assert float(n_c) == 3 and math.isclose(float(ce_c), float(ce), rel_tol=1e-5)
