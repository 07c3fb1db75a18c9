"""The reading gauge (`hat_jax.data.reading_gauge`, experiments/benchmarks/reading_gauge.py): each family draws
the names it says, the rendered row masks exactly the assistant turn and the called name, the exact score on a
hand case, bad input named, and the benchmark end to end on a fresh micro model (its curve in --json)."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hat_jax.data.reading_gauge import (FAMILIES, INTENT_LABELS, ORDERS, encode_row, exact_names, first_token_chance,
                                        gauge_batch, gauge_messages, listed_names, name_token_hits, tool_names)
from hat_jax.harness.hsa_vocab import (HELDOUT_TOOL_STYLES, TRAIN_TOOL_STYLES, name_style, parse_tool_name,
                                       reserved_combo)
from hat_jax.tokenizer import train_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(1)
    texts = [m["content"] for _ in range(200) for m in gauge_messages(rng, rng.choice(FAMILIES))[0][:2]]
    return train_bpe_tokenizer(texts, 600, tmp_path_factory.mktemp("bpe"))


def test_each_family_draws_its_names():
    rng = random.Random(0)
    intents = sorted(INTENT_LABELS)
    assert tool_names(intents, "fixed", rng) == {i: i for i in intents}
    for family, styles, reserved in (("renamed", TRAIN_TOOL_STYLES, False), ("heldout", HELDOUT_TOOL_STYLES, True),
                                     ("anystyle", TRAIN_TOOL_STYLES + HELDOUT_TOOL_STYLES, False)):
        for _ in range(20):
            names = tool_names(intents, family, rng)
            assert len(set(names.values())) == len(intents)
            for name in names.values():
                assert name_style(name) in styles, (family, name)
                prefix, verb, noun = parse_tool_name(name)
                assert reserved_combo(verb, *noun) is reserved, (family, name)


def test_anystyle_writes_the_heldout_styles_on_unreserved_combinations():
    rng = random.Random(2)
    drawn = [name_style(n) for _ in range(60) for n in tool_names(sorted(INTENT_LABELS), "anystyle", rng).values()]
    assert set(drawn) == set(TRAIN_TOOL_STYLES + HELDOUT_TOOL_STYLES)


def test_the_row_masks_the_assistant_turn_and_the_called_name(tokenizer):
    rng = random.Random(3)
    for family in FAMILIES:
        messages, name = gauge_messages(rng, family)
        assert f": {name}\n" in messages[0]["content"] and messages[1]["content"] in INTENT_LABELS.values()
        ids, loss, named = encode_row(tokenizer, messages, name)
        text = tokenizer.decode(ids)
        turn = tokenizer.decode(ids[loss.astype(bool)])
        assert text.endswith(turn) and name in turn and "<tool_call>" in turn and "工具列表" not in turn
        assert name in tokenizer.decode(ids[named.astype(bool)])
        assert not np.any(named & (1 - loss))  # the name tokens are inside the assistant turn


def test_the_order_puts_the_name_before_or_after_its_label():
    for order, entry in (("label_first", "- {label}: {name}\n"), ("name_first", "- {name}: {label}\n")):
        messages, name = gauge_messages(random.Random(5), "renamed", order=order)
        label = messages[1]["content"]
        assert entry.format(label=label, name=name) in messages[0]["content"] + "\n", order
    same = [gauge_messages(random.Random(5), "renamed", order=o)[1] for o in ORDERS]
    assert same[0] == same[1]  # the order changes the layout only, not the draw


def test_exact_names_needs_every_name_token():
    ids = np.array([[5, 6, 7, 8], [5, 6, 7, 8]])
    mask = np.array([[0, 0, 1, 1], [0, 0, 1, 1]])
    argmax = np.array([[9, 7, 8, 0], [9, 7, 3, 0]])  # position t guesses token t+1
    assert exact_names(argmax, ids, mask).tolist() == [True, False]
    assert exact_names(argmax, ids, np.zeros_like(mask)).tolist() == [False, False]  # no name: not a hit


def test_name_token_hits_split_the_first_token_from_the_rest():
    ids = np.array([[5, 6, 7, 8, 4]] * 4)
    mask = np.array([[0, 0, 1, 1, 1]] * 3 + [[0, 0, 0, 1, 0]])  # a 3-token name; a 1-token name in the last row
    argmax = np.array([[9, 7, 8, 4, 0],   # all three right
                       [9, 1, 8, 4, 0],   # the first wrong, the rest right
                       [9, 7, 8, 2, 0],   # the first right, the last wrong
                       [9, 1, 8, 1, 0]])  # a one-token name, right: rest holds nothing to miss
    first, rest = name_token_hits(argmax, ids, mask)
    assert first.tolist() == [True, False, True, True] and rest.tolist() == [True, True, False, True]
    assert ((first & rest) == exact_names(argmax, ids, mask)).all()
    none = name_token_hits(argmax, ids, np.zeros_like(mask))
    assert none[0].tolist() == none[1].tolist() == [False] * 4  # no name: neither


def test_first_token_chance_draws_the_benchmark_rows_and_counts_shared_first_tokens(tokenizer):
    rows, chance = random.Random(3), random.Random(3)
    batch = gauge_batch(tokenizer, rows, "renamed", 16, 160, order="name_first")
    share = first_token_chance(tokenizer, chance, "renamed", 16, order="name_first")
    assert rows.getstate() == chance.getstate()  # the same draws as gauge_batch: the scored rows themselves
    assert batch["name_mask"].any(axis=1).all() and 1 / 5 <= share <= 1
    assert first_token_chance(tokenizer, random.Random(0), "renamed", 8, n_tools=1) == 1.0  # one tool: no choice
    messages, name = gauge_messages(random.Random(4), "fixed", order="name_first")
    listed = listed_names(messages, "name_first")
    assert name in listed and len(listed) == 5 and set(listed) <= set(INTENT_LABELS)


def test_bad_input_is_named(tokenizer):
    with pytest.raises(ValueError, match="family 'other'"):
        tool_names(["get_price"], "other", random.Random(0))
    with pytest.raises(ValueError, match="n_tools=9"):
        gauge_messages(random.Random(0), "fixed", n_tools=9)
    with pytest.raises(ValueError, match="order 'json'"):
        gauge_messages(random.Random(0), "fixed", order="json")
    with pytest.raises(ValueError, match="> width 8"):
        gauge_batch(tokenizer, random.Random(0), "fixed", 2, 8)


def test_the_benchmark_prints_and_writes_its_curve(tmp_path):
    out = tmp_path / "curve.json"
    proc = subprocess.run([sys.executable, str(ROOT / "experiments/benchmarks/reading_gauge.py"), "--preset", "micro",
                           "--steps", "2", "--eval-every", "1", "--eval-rows", "8", "--batch", "4",
                           "--train", "fixed,renamed", "--model-set", "full_attention_interval=1", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads(out.read_text())
    assert written["layer_types"] and set(written["layer_types"]) == {"full_attention"}  # --model-set reached it
    assert written["tokenizer_split"] == "qwen"  # the fresh model's BPE split, recorded with the curve
    curve = written["curve"]
    assert [c["step"] for c in curve] == [0, 1, 2]
    assert all(set(c[k]) == set(FAMILIES) for c in curve for k in ("exact", "first", "rest"))
    assert all(c["exact"][f] <= min(c["first"][f], c["rest"][f]) for c in curve for f in FAMILIES)
    assert np.isfinite(curve[-1]["loss"]) and "step     2" in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "experiments/benchmarks/reading_gauge.py"), "--train", "fixd"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "['fixd'] not among" in bad.stderr
    bad = subprocess.run([sys.executable, str(ROOT / "experiments/benchmarks/reading_gauge.py"), "--model-set", "x"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "'x': expected FIELD=JSON" in bad.stderr
    bad = subprocess.run([sys.executable, str(ROOT / "experiments/benchmarks/reading_gauge.py"), "--init", "ckpt",
                          "--tokenizer-split", "words"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "--init loads the checkpoint's tokenizer/" in bad.stderr
