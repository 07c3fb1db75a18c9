"""The read probe: span matching on loss-token text, and the teacher-forced counts on a scripted model."""

import numpy as np
import pytest

from hat_jax.eval.read_probe import read_probe, span_hits

# One assistant turn split into tokens, with whether each was predicted right.
PIECES = ["观众在问", "价格", "，先加载技能", "price", "-promotion", "。查价格，用", "get", "_price", "。\n<tool_call>\n",
          "<parameter=query>\n", "鹿角", "奶瓶", "\n</parameter>", "P00", "60", "到手价", "29", "元"]
CORRECT = [False, True, True, True, True, True, True, False, True, False, True, False, True, True, True, True, False,
           True]


def test_span_hits_needs_every_overlapping_token():
    hits = span_hits(PIECES, CORRECT)
    # intent "价格": its one token right. argument "鹿角奶瓶": 奶瓶 wrong (the pattern's own
    # "<parameter=query>" token does not count), and so is the query. product id "P0060" over two right tokens. price "29" wrong.
    # skill "price-promotion": both tokens right. tool "get_price": "_price" wrong.
    assert hits == {"intent": [1, 1], "argument": [0, 1], "query": [0, 1], "product_id": [1, 1], "price": [0, 1],
                    "skill": [1, 1], "tool": [0, 1]}
    assert span_hits([], []) == {k: [0, 0] for k in ("intent", "argument", "query", "product_id", "price", "skill",
                                                    "tool")}
    with pytest.raises(ValueError, match="2 pieces but 1 correctness flags"):
        span_hits(["a", "b"], [True])


class _Vocab:
    def decode(self, ids):
        return "".join(PIECES[i - 1] for i in ids)


def test_read_probe_scores_a_scripted_model():
    # Row: token 0 is a prompt token (id 99), then the 12 pieces (ids 1..12), then 2 padding slots.
    n = len(PIECES)
    ids = np.array([[99] + list(range(1, n + 1)) + [0, 0]], np.int32)
    loss = np.array([[0] + [1] * n + [0, 0]], np.int32)
    attn = np.array([[1] * (n + 1) + [0, 0]], np.int32)

    def logits_fn(input_ids, attention_mask):
        assert attention_mask.dtype == bool and attention_mask.sum() == n + 1
        out = np.zeros((1, input_ids.shape[1], 100), np.float32)
        for t in range(n):  # position t predicts token t + 1 = piece t: right where CORRECT says so
            out[0, t, (t + 1) if CORRECT[t] else 98] = np.log(3.0)  # p(argmax) = 3 / (3 + 99)
        return out

    result = read_probe(logits_fn, _Vocab(), [{"input_ids": ids, "attention_mask": attn, "loss_mask": loss}])
    assert result.spans == span_hits(PIECES, CORRECT)
    assert result.tokens == n and result.token_accuracy == pytest.approx(sum(CORRECT) / n)
    right, wrong = np.log(102 / 3), np.log(102)  # NLL of the target when it is / is not the argmax
    assert result.nll == pytest.approx((sum(CORRECT) * right + (n - sum(CORRECT)) * wrong) / n, rel=1e-6)
    assert result.rates()["product_id"] == 1.0 and result.rates()["price"] == 0.0
    with pytest.raises(ValueError, match="no loss token"):
        read_probe(logits_fn, _Vocab(), [{"input_ids": ids, "attention_mask": attn, "loss_mask": 0 * loss}])
