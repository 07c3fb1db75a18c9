"""The tiny base (hat_jax.train.pretrain) on the micro preset:

- rows and loss mask by hand (the mask covers exactly the non-pad tokens after position 0), the data order and
  its resume state, the config hash and bad fields;
- base_checkpoint end to end: the stage-run-dir layout and report, a second call served from the cache, SFT
  from the base (same tokenizer), a killed run resumed from its partial folder bit-identically, a concurrent
  caller waiting on the lock, the CLI's JSON line;
- import_hf_base on a micro HF export (save_hf_checkpoint) with a saved tokenizer, and its missing-file errors.
World data and tokenizers are cached in a module temp dir (HAT_JAX_CACHE).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model.checkpoint_io import load_model_checkpoint
from hat_jax.train import pretrain
from hat_jax.train.losses import masked_token_ce_sum
from hat_jax.data.packing import DataStateFormatError, PackedBatches
from hat_jax.cache import exclusive_lock
from hat_jax.train.hf_base import import_hf_base
from hat_jax.train.pretrain import (PretrainBatches, PretrainConfig, base_checkpoint, chat_order, pretraining_batches,
                                    pretraining_rows)
from hat_jax.train.stage import apply_overrides, stage_section


def micro_base() -> PretrainConfig:
    """The micro scale's base (configs/micro.py)."""
    return stage_section("micro", "base.pretrain")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("HAT_JAX_CACHE", str(path))
    yield path
    patch.undo()


@pytest.fixture(scope="module")
def base(cache, tmp_path_factory) -> Path:
    """The uninterrupted micro base (in its own bases folder)."""
    return base_checkpoint(micro_base(), cache_dir=tmp_path_factory.mktemp("bases"), progress=False)


def _leaves(path):
    return jax.tree_util.tree_leaves_with_path(load_model_checkpoint(path)[1])


# ---------------------------------------------------------------------------------------------- by hand

def test_rows_and_loss_mask_cover_exactly_the_non_pad_tokens():
    rows = pretraining_rows([[5, 6, 7], [9], [1, 2, 3, 4, 5, 6]], seq_len=4, pad_id=0)
    assert rows["input_ids"].tolist() == [[5, 6, 7, 0], [9, 0, 0, 0], [1, 2, 3, 4]]
    assert rows["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert rows["loss_mask"].tolist() == [[0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1]]  # t = 0 has no context
    assert rows["truncated"].tolist() == [0, 0, 1]
    # Uniform logits over V = 8: the CE sum is (number of loss tokens) * ln 8, the count 2 + 0 + 3.
    ce, n = masked_token_ce_sum(jnp.zeros((3, 4, 8)), jnp.asarray(rows["input_ids"]), jnp.asarray(rows["loss_mask"]))
    assert float(n) == 5 and math.isclose(float(ce), 5 * math.log(8), rel_tol=1e-6)


class _CharTokenizer:
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + ord(c) % 50 for c in text[-12:]]}


def test_batches_visit_each_chat_once_per_epoch_and_resume_exactly():
    chats = [([{"role": "user", "content": f"chat {i}"}], []) for i in range(6)]
    stream = PretrainBatches(chats, _CharTokenizer(), seq_len=8, batch_size=2, seed=3)
    assert sorted(stream.chat_index(r) for r in range(6)) == list(range(6))
    assert [stream.chat_index(r) for r in range(6)] != [stream.chat_index(r) for r in range(6, 12)]  # reshuffled
    first = [next(stream) for _ in range(4)]
    state = stream.get_state()
    assert state["batches"] == 4 and state["tokens"] == sum(int(b["attention_mask"].sum()) for b in first)
    want = next(stream)
    again = PretrainBatches(chats, _CharTokenizer(), seq_len=8, batch_size=2, seed=3)
    again.set_state(json.loads(json.dumps(state)))
    got = next(again)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    with pytest.raises(ValueError, match="'tokens' must be an int"):
        again.set_state({"batches": 1, "truncated_rows": 0})


class _XTokenizer:
    """One token per "x" of the text plus one: a chat whose user turn is "x" * L is a document of L + 1 tokens."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [7] * text.count("x") + [3]}


def test_packed_batches_hold_the_stream_in_order_and_resume_exactly():
    lengths = [2, 5, 1, 7, 3, 4, 6, 2]  # documents of 3, 6, 2, 8, 4, 5, 7, 3 tokens
    chats = [([{"role": "user", "content": "x" * n}], []) for n in lengths]
    config = PretrainConfig(seq_len=10, batch_size=2, pack_bins=2, seed=3)  # one batch = one group of open rows
    stream = pretraining_batches(chats, _XTokenizer(), config)
    first = [next(stream) for _ in range(3)]
    state = stream.get_state()
    order = [lengths[chat_order(len(chats), 3, r)] + 1 for r in range(state["documents"])]
    got = sorted(int(n) for b in first for row in b["segment_ids"] for n in np.bincount(row)[1:])
    assert got == sorted(order)  # the batches hold exactly the first stream rows, each chat whole
    assert state["tokens"] == sum(order) == sum(int(np.count_nonzero(b["segment_ids"])) for b in first)
    assert all(int(b["loss_mask"].sum()) == int(np.count_nonzero(b["segment_ids"])) - int(b["documents"].sum())
               for b in first)  # every token but each chat's first
    want = next(stream)
    again = pretraining_batches(chats, _XTokenizer(), config)
    again.set_state(json.loads(json.dumps(state)))
    got = next(again)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    with pytest.raises(DataStateFormatError, match="pretraining data state: .*unpacked pipeline"):
        again.set_state({"batches": 4, "tokens": 40, "truncated_rows": 0})
    with pytest.raises(DataStateFormatError, match="pretraining data state: .*format 'packed-v1', this pipeline is unpacked"):
        PretrainBatches(chats, _XTokenizer(), 10, 2, 3).set_state(state)
    # a chat longer than the row: counted when truncation is on, an error naming the chat when off
    long_chats = chats + [([{"role": "user", "content": "x" * 30}], [])]
    cut = pretraining_batches(long_chats, _XTokenizer(), config)
    while cut.get_state()["documents"] < 2 * len(long_chats):
        next(cut)
    assert cut.truncated >= 1 and cut.get_state()["truncated_documents"] == cut.truncated
    strict = pretraining_batches(long_chats, _XTokenizer(), dataclasses.replace(config, truncate=False))
    with pytest.raises(ValueError, match=r"document pretraining chat 8 \(stream row \d+\): 31 tokens > seq_len 10 "
                                         "and truncation is off"):
        for _ in range(len(long_chats)):
            next(strict)


def test_config_hash_and_bad_fields(monkeypatch):
    micro = micro_base()
    assert micro.digest() == micro_base().digest()
    from hat_jax.train import pretrain

    before = micro.digest()
    monkeypatch.setattr(pretrain, "INIT_SCHEME", "another-init")  # a base cached under another init is not reused
    assert micro.digest() != before
    monkeypatch.undo()
    # nor one whose corpus or exercise generators made other chats, in any phase of a continued base
    reading = dataclasses.replace(micro, reading_share=0.5, reading_kinds=("label",))
    more = dataclasses.replace(micro, init=reading, steps=micro.steps + 1)
    digests = (micro.digest(), reading.digest(), more.digest())
    pretrain.corpus_fingerprint.cache_clear()
    monkeypatch.setattr(pretrain, "reading_chats",
                        lambda n, seed, kinds, symbols=(): [([{"role": "user", "content": "x"}], [])] * n)
    assert micro.digest() == digests[0]  # no exercises in it
    assert reading.digest() != digests[1] and more.digest() != digests[2]
    monkeypatch.undo()
    pretrain.corpus_fingerprint.cache_clear()
    assert (micro.digest(), reading.digest(), more.digest()) == digests
    # exercises drawing from the vocabulary are another corpus; a base without them keeps its name
    vocab = dataclasses.replace(reading, reading_vocab=True)
    assert "reading_vocab" not in reading.to_json() and vocab.to_json()["reading_vocab"] is True
    assert "reading_kinds" not in micro.to_json() and reading.to_json()["reading_kinds"] == ["label"]
    # an lm_head started from the embedding is another base; the default keeps every earlier name
    tied = dataclasses.replace(micro, lm_head_init="embedding")
    assert "lm_head_init" not in micro.to_json() and tied.to_json()["lm_head_init"] == "embedding"
    assert tied.digest() != micro.digest()
    trained_tied = dataclasses.replace(tied, tie_lm_head=True)
    assert "tie_lm_head" not in tied.to_json() and trained_tied.digest() != tied.digest()
    assert len({vocab.digest(), reading.digest(), dataclasses.replace(more, init=vocab).digest()}) == 3
    tiny = stage_section("tiny", "base.pretrain")
    assert len({micro.digest(), apply_overrides(micro, ["seq_len=512"]).digest(),
                apply_overrides(micro, ["optim.lr=0.001"]).digest(), tiny.digest()}) == 4
    # total_steps null hashes as the steps it stands for; other steps move the schedule and the digest
    assert apply_overrides(micro, [f"optim.total_steps={micro.steps}"]).digest() == micro.digest()
    assert apply_overrides(micro, ["steps=3"]).digest() != micro.digest()
    kinds = apply_overrides(reading, ['reading_kinds=["label", "lookup"]'])
    assert kinds.reading_kinds == ("label", "lookup") and kinds.digest() != reading.digest()
    # without exercises (reading_share 0) their kinds and source shape no chat and leave the name alone
    assert apply_overrides(micro, ['reading_kinds=["label"]', "reading_vocab=true"]).digest() == micro.digest()
    for field, value, message in (("seq_len", 0, "PretrainConfig.seq_len = 0: expected an int >= 2"),
                                  ("batch_size", 3, r"batch_size \(3\) must be a multiple of accum_steps \(2\)"),
                                  ("compute_dtype", "fp8", "compute_dtype = 'fp8'; valid"),
                                  ("preset", "huge", "unknown preset 'huge'.*Valid presets: micro, tiny"),
                                  ("n_chats", 1.5, "PretrainConfig.n_chats = 1.5"),
                                  ("reading_share", 1.5, r"reading_share = 1.5: expected a share in \[0, 1\]"),
                                  ("reading_kinds", ("label", "quiz"), r"reading_kinds = .*\(unknown: \['quiz'\]\)"),
                                  ("reading_kinds", (), r"reading_kinds = \(\): expected a non-empty tuple"),
                                  ("reading_vocab", 1, "PretrainConfig.reading_vocab = 1: expected a bool"),
                                  ("lm_head_init", "tied", r"PretrainConfig.lm_head_init = 'tied'; expected one of "
                                                           r"\('normal', 'embedding'\)"),
                                  ("tie_lm_head", True, r"PretrainConfig.tie_lm_head = True needs lm_head_init = "
                                                        r"'embedding' \(a tied lm_head starts as the embedding's "
                                                        r"transpose\), got 'normal'"),
                                  ("tie_lm_head", 1, "PretrainConfig.tie_lm_head = 1: expected a bool"),
                                  ("tokenizer_split", "bytes", r"tokenizer_split = 'bytes': expected one of \['chars', 'qwen', 'scripts', 'words'\]")):
        extra = {"accum_steps": 2} if field == "batch_size" else {}
        with pytest.raises(ValueError, match=message):
            PretrainConfig(**{field: value, **extra})
    with pytest.raises(ValueError, match=r"unknown preset 'smal' \(did you mean 'small'\?\); valid presets: micro, "
                                         r"qwen3_6_35b_a3b, small, tiny"):
        stage_section("smal", "base.pretrain")
    with pytest.raises(ValueError, match=r"preset 'qwen3_6_35b_a3b' has no base.pretrain config to run"):
        stage_section("qwen3_6_35b_a3b", "base.pretrain")
    with pytest.raises(ValueError,
                       match=r"unknown field 'seqlen' of PretrainConfig \(did you mean 'seq_len'\?\); valid: .*seq_len"):
        apply_overrides(micro, ["seqlen=3"])


def test_a_continued_base_names_its_init_and_keeps_the_model_and_tokenizer():
    micro = micro_base()
    assert "init" not in micro.to_json()  # bases that continue none keep their names
    more = dataclasses.replace(micro, init=micro, steps=2)
    assert more.to_json()["init"] == micro.to_json() and more.digest() != micro.digest()
    assert dataclasses.replace(more, init=dataclasses.replace(micro, seed=1)).digest() != more.digest()
    with pytest.raises(ValueError, match=r"PretrainConfig.init.tokenizer_texts = 3 differs from "
                                         r"PretrainConfig.tokenizer_texts = 200: a continued base keeps"):
        dataclasses.replace(micro, init=dataclasses.replace(micro, tokenizer_texts=3))
    with pytest.raises(ValueError, match=r"PretrainConfig.init: expected a PretrainConfig \(the base to continue\) "
                                         r"or None, got str"):
        dataclasses.replace(micro, init="runs/base")


# ---------------------------------------------------------------------------------------------- end to end

def test_base_layout_report_and_cache(base, monkeypatch):
    assert base.name == f"base-{micro_base().digest()}"
    names = {p.name for p in base.iterdir()}
    assert {"model_config.json", "tokenizer", "stage_config.json", "metrics.jsonl", "base_report.json", "4"} <= names
    assert not base.with_name(base.name + ".partial").exists()
    report = json.loads((base / "base_report.json").read_text())
    assert report["steps"] == 4 and report["resumed_from"] is None and report["loss_first_step"] == 1
    assert report["loss_final"] < report["loss_first"] < math.log(4096) + 0.1, report["loss_curve"]
    assert report["tokens"] > 0 and report["rows"] == 8 and report["documents"] >= 8 and report["wall_s"] > 0
    assert report["probe"]["n"] == 4 and 0 <= report["probe"]["exact"] <= 1 and report["probe"]["name_nll"] > 0
    # The probe's targets: the tokens after the longest token prefix the prompt and prompt + name + ">" share.
    from hat_jax.data.corpus import recall_probe, render_chat
    from hat_jax.tokenizer import load_tokenizer
    from hat_jax.train.recall_probe import probe_targets

    tok = load_tokenizer(base / "tokenizer")
    probes = recall_probe(4, 0)
    for probe, (ids, c) in zip(probes, probe_targets(tok, probes), strict=True):
        prompt = render_chat(probe.messages, probe.tools, add_generation_prompt=True) + probe.assistant_prefix
        head, tail = tok.decode(ids[:c]), tok.decode(ids[c:])
        assert prompt.startswith(head) and head + tail == prompt + probe.expected_name + ">"
        assert len(prompt) - len(head) <= 1, tail  # at most the "=" merges with the name's first piece
    rows = [json.loads(line) for line in (base / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["eval/recall_exact"] == report["probe"]["exact"]
    # one row per step (micro logs every step): the steps' slot fills add up to the report's real tokens
    fills = [r["data/slot_fill"] for r in rows if "data/slot_fill" in r]
    slots = report["rows"] // report["steps"] * micro_base().seq_len
    assert len(fills) == 4 and math.isclose(sum(fills) * slots, report["tokens"], rel_tol=1e-9)
    gauge = report["reading_gauge"]
    assert gauge["rows"] == 4 and set(gauge["exact"]) == {"fixed", "renamed", "heldout"}
    assert report["reading"] == {"chats_per_kind": 0, "kinds": {}}  # no reading exercises in this base
    assert all(rows[-1][f"eval/gauge_{f}"] == v and v in (0, 0.25, 0.5, 0.75, 1) for f, v in gauge["exact"].items())

    def no_training(*args, **kwargs):
        raise AssertionError("a cached base was retrained")

    monkeypatch.setattr(pretrain, "train_base", no_training)
    assert base_checkpoint(micro_base(), cache_dir=base.parent) == base


def test_a_continued_tied_base_builds_its_init_first_and_starts_from_its_last_step(cache, tmp_path, monkeypatch):
    # both phases train the lm_head tied to the embedding (the second inherits the fields with `replace`)
    first = dataclasses.replace(micro_base(), steps=2, ckpt_every=2, lm_head_init="embedding", tie_lm_head=True)
    second = dataclasses.replace(first, init=first, steps=2, reading_share=0.5, reading_kinds=("tools",))
    started = []
    run_masked_ce = pretrain.run_masked_ce

    def spy(run, config, model_config, params, *args, **kwargs):
        started.append((config.digest(), jax.tree.map(np.array, params)))  # copied: the train step donates them
        return run_masked_ce(run, config, model_config, params, *args, **kwargs)

    monkeypatch.setattr(pretrain, "run_masked_ce", spy)
    path = base_checkpoint(second, cache_dir=tmp_path, progress=False)
    init_path = tmp_path / f"base-{first.digest()}"
    assert path.name == f"base-{second.digest()}" and (init_path / "base_report.json").is_file()
    assert [d for d, _ in started] == [first.digest(), second.digest()]
    _, init_params = load_model_checkpoint(init_path)
    for (where, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(started[1][1]),
                                  jax.tree_util.tree_leaves_with_path(init_params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(where))
    report = json.loads((path / "base_report.json").read_text())
    assert report["steps"] == 2 and report["reading"]["kinds"].keys() == {"tools"}
    # the time of both phases: the first's from its report, the second's less the time it spent building the first
    first_report = json.loads((init_path / "base_report.json").read_text())
    assert first_report["init_wall_s"] is None and first_report["chain_wall_s"] == first_report["wall_s"]
    assert report["init_wall_s"] == first_report["chain_wall_s"]
    assert report["init_wall_s"] < report["chain_wall_s"] < report["wall_s"] + report["init_wall_s"]
    for trained in (init_params, load_model_checkpoint(path)[1]):
        embedding = np.asarray(trained["model"]["embed_tokens"]["embedding"])
        np.testing.assert_array_equal(np.asarray(trained["lm_head"]["kernel"]), embedding.T)
    assert not np.array_equal(embedding, np.asarray(started[0][1]["model"]["embed_tokens"]["embedding"]))


def test_reading_exercise_figures_equal_one_chat_at_a_time(base):
    """Batched, padded scoring equals an unpadded forward per chat, answer by answer, and so do its splits by
    order and by role."""
    from hat_jax.data.corpus import render_chat
    from hat_jax.data.reading import answer_order, answer_role, exercise_answer_spans, reading_chats, token_symbols
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
    from hat_jax.tokenizer import load_tokenizer
    from hat_jax.train.recall_probe import reading_exercise_figures

    tok = load_tokenizer(base / "tokenizer")
    config, params = load_model_checkpoint(base)
    kinds = ("lookup", "label", "results")
    symbols = token_symbols(tok)  # results brands from the vocabulary, as a base with reading_vocab trains them
    figures = reading_exercise_figures(params, config, tok, 3, kinds, seed=5, batch_size=2, symbols=symbols)
    model = Qwen3_5MoeForCausalLM(config)
    forward = jax.jit(lambda p, ids: model.apply({"params": p}, ids).logits)  # one compile per chat length

    def split(pairs):
        return {k: {"answers": len(v), "exact": np.mean([e for e, _ in v]), "first_token": np.mean([f for _, f in v])}
                for k, v in pairs.items()} if pairs else None

    for kind in kinds:
        exact, first, right, total, by_order, by_role = [], [], 0, 0, {}, {}
        for messages, tools in reading_chats(3, 5, kinds=[kind], symbols=symbols):
            text = render_chat(messages, tools)
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = jnp.asarray([enc["input_ids"]])
            guess = np.asarray(jnp.argmax(forward(params, ids)[0], axis=-1))
            turns = [m for m in messages if m["role"] == "assistant"]
            for (a, b), turn in zip(exercise_answer_spans(text, messages), turns, strict=True):
                tokens = [t for t, (s, e) in enumerate(enc["offset_mapping"]) if s < b and e > a]
                hit = [guess[t - 1] == enc["input_ids"][t] for t in tokens]
                exact.append(all(hit))
                first.append(hit[0])
                right, total = right + sum(hit), total + len(hit)
                if (order := answer_order(messages, tools, text[a:b])) is not None:
                    by_order.setdefault(order, []).append((all(hit), hit[0]))
                by_role.setdefault(answer_role(turn), []).append((all(hit), hit[0]))
        got = figures["kinds"][kind]
        assert got["answers"] == len(exact) and got["exact"] == np.mean(exact)
        assert got["first_token"] == np.mean(first) and got["token_acc"] == right / total
        assert got.get("by_order") == split(by_order)
        assert got.get("by_role") == (split(by_role) if len(by_role) > 1 else None)
    assert "by_order" not in figures["kinds"]["lookup"] and figures["kinds"]["label"]["by_order"]
    assert {"query", "id", "reply"} <= set(figures["kinds"]["results"]["by_role"])
    assert figures["kinds"]["results"]["by_role"]["id"]["answers"] == 6  # two rounds of 3 chats
    assert set(figures["kinds"]["label"]["by_role"]) == {"name", "reply"} and "by_role" not in figures["kinds"]["lookup"]
    assert reading_exercise_figures(params, config, tok, 0, ["lookup"]) == {"chats_per_kind": 0, "kinds": {}}


def test_base_reading_script_scores_every_saved_step(base, tmp_path, capsys):
    """experiments/benchmarks/base_reading.py: one line and one curve point per step folder, the figures of the
    three scoring functions on that step's weights; an unsaved step is refused naming the saved ones."""
    import importlib.util

    from hat_jax.tokenizer import load_tokenizer
    from hat_jax.train.recall_probe import reading_exercise_figures, reading_gauge_figures, recall_probe_figures

    spec = importlib.util.spec_from_file_location(
        "base_reading", Path(__file__).resolve().parents[2] / "experiments" / "benchmarks" / "base_reading.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    steps = sorted(int(d.name) for d in base.iterdir() if d.is_dir() and d.name.isdigit())
    assert steps
    out = tmp_path / "curve.json"
    assert script.main([str(base), "--items", "4", "--kinds", "label,copy", "--json", str(out)]) == 0
    curve = json.loads(out.read_text())["curve"]
    assert [point["step"] for point in curve] == steps
    assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]) == len(steps)
    tok = load_tokenizer(base / "tokenizer")
    config, params = load_model_checkpoint(base / str(steps[-1]))
    assert curve[-1]["probe"] == recall_probe_figures(params, config, tok, 4)
    assert curve[-1]["reading_gauge"] == reading_gauge_figures(params, config, tok, 4)
    assert curve[-1]["reading"] == reading_exercise_figures(params, config, tok, 1, ["label", "copy"])
    for argv, message in (([str(base), "--steps", str(steps[-1] + 1)], f"not saved in {base} (saved: {steps})"),
                          ([str(tmp_path / "none")], "none: not a folder"),
                          ([str(base), "--steps", "abc"], "--steps 'abc': expected a comma list"),
                          ([str(base), "--items", "0"], "--items 0: expected a count >= 1"),
                          ([str(base), "--kinds", "quiz"], "--kinds = ['quiz']: expected a non-empty tuple or list")):
        with pytest.raises(SystemExit):
            script.main(argv)
        assert message in capsys.readouterr().err


def test_reading_gauge_pads_to_its_longest_row(base):
    """Rows are padded to the longest one (rounded up to 32), so the figures do not depend on `width` once every row
    fits; a row longer than `width` is refused with its length."""
    import random

    from hat_jax.data.reading_gauge import FAMILIES, gauge_batch
    from hat_jax.tokenizer import load_tokenizer
    from hat_jax.train.recall_probe import PROBE_SEED, reading_gauge_figures

    tok = load_tokenizer(base / "tokenizer")
    steps = sorted(int(d.name) for d in base.iterdir() if d.is_dir() and d.name.isdigit())
    config, params = load_model_checkpoint(base / str(steps[-1]))
    longest = max(int(gauge_batch(tok, random.Random(f"gauge-{PROBE_SEED}-{i}"), family, 32, 4096)["attention_mask"]
                      .sum(1).max()) for i, family in enumerate(FAMILIES))
    wide = reading_gauge_figures(params, config, tok, 1, width=4096)
    assert reading_gauge_figures(params, config, tok, 1, width=longest) == wide and set(wide["exact"]) == set(FAMILIES)
    with pytest.raises(ValueError, match=r"reading gauge row of \d+ tokens > width 8: raise --width"):
        reading_gauge_figures(params, config, tok, 1, width=8)


def test_sft_from_the_base_uses_its_tokenizer(base, tmp_path):
    from hat_jax.train.sft import SFTConfig, run_sft

    config: SFTConfig = apply_overrides(stage_section("micro", "sft"), ["steps=1", f"init={base}", "log_every=1"])
    state = run_sft(config, tmp_path / "sft", progress=False)
    assert int(state.step) == 1
    assert (tmp_path / "sft" / "tokenizer" / "tokenizer.json").read_bytes() == \
        (base / "tokenizer" / "tokenizer.json").read_bytes()


def test_killed_run_resumes_from_its_partial_folder(base, tmp_path, monkeypatch):
    calls = {"n": 0}
    real_next = PackedBatches.__next__

    def dying_next(self):
        calls["n"] += 1
        if calls["n"] == 4:  # after the step-2 checkpoint
            raise KeyboardInterrupt("killed")
        return real_next(self)

    monkeypatch.setattr(PackedBatches, "__next__", dying_next)
    with pytest.raises(KeyboardInterrupt):
        base_checkpoint(micro_base(), cache_dir=tmp_path, progress=False)
    partial = tmp_path / (base.name + ".partial")
    assert not (tmp_path / base.name).exists() and (partial / "2").is_dir() and not (partial / "4").exists()
    monkeypatch.setattr(PackedBatches, "__next__", real_next)
    resumed = base_checkpoint(micro_base(), cache_dir=tmp_path, progress=False)
    assert resumed == tmp_path / base.name and not partial.exists()
    assert json.loads((resumed / "base_report.json").read_text())["resumed_from"] == 2
    for (path, want), (_, got) in zip(_leaves(base), _leaves(resumed), strict=True):
        assert np.array_equal(np.asarray(want), np.asarray(got)), f"{jax.tree_util.keystr(path)} differs after resume"


def test_concurrent_caller_waits_for_the_lock_then_finds_the_base(base, tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain, "train_base", lambda *a, **k: pytest.fail("the waiting caller trained"))
    final = tmp_path / base.name
    result = {}
    with exclusive_lock(tmp_path / (base.name + ".lock")):  # another process building the base
        thread = threading.Thread(target=lambda: result.setdefault(
            "path", base_checkpoint(micro_base(), cache_dir=tmp_path, progress=False)))
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()  # blocked on the lock
        shutil.copytree(base, final)  # the holder finishes (its rename)
    thread.join(30)
    assert result["path"] == final


def test_cli_prints_the_cached_base(base, cache):
    env = {**os.environ, "HAT_JAX_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "hat_jax.train.pretrain", "--preset", "micro", "--no-progress",
                           "--cache-dir", str(base.parent)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["run_dir"] == str(base) and line["step"] == 4
    with pytest.raises(ValueError, match="PretrainConfig.seq_len = 1: expected an int >= 2"):
        pretrain.main(["--preset", "micro", "--set", "seq_len=1", "--cache-dir", str(base.parent)])


# ---------------------------------------------------------------------------------------------- HF import

def test_import_hf_base(tmp_path):
    from hat_jax.model import init_params
    from hat_jax.model.config import get_config
    from hat_jax.model.hf_io import save_hf_checkpoint
    from hat_jax.rollout import tokenizer_from_checkpoint
    from hat_jax.tokenizer import train_bpe_tokenizer
    from hat_jax.train.sft import load_init_params

    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    train_bpe_tokenizer(["a tiny corpus for a tiny tokenizer"] * 4, 300, tmp_path / "tok")
    save_hf_checkpoint(params, config, tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    out = import_hf_base(tmp_path / "hf", tmp_path / "base")
    assert tokenizer_from_checkpoint(str(out)) == out / "tokenizer"
    stored, loaded = load_model_checkpoint(out)
    assert stored.replace(extra=()) == config  # extra: the HF file's own keys (architectures, dtype)
    leaves = jax.tree_util.tree_leaves(loaded)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params), leaves, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)
    load_init_params(out, config, "SFT init")  # what every stage's --init does
    assert import_hf_base(tmp_path / "hf", tmp_path / "base") == out  # a finished import is returned
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("")
    with pytest.raises(FileExistsError, match="other.*not an empty folder"):
        import_hf_base(tmp_path / "hf", tmp_path / "other")
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "hf", broken)
    (broken / "tokenizer.json").unlink()
    (broken / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"broken.*lacks: config.json .*; tokenizer.json"):
        import_hf_base(broken, tmp_path / "base2")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        import_hf_base(tmp_path / "nowhere", tmp_path / "base3")
