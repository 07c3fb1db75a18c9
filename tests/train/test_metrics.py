"""Metrics: documented tags only, TensorBoard events + JSONL mirror, resume purge, run-directory layout."""

from pathlib import Path

import pytest

from hat_jax.train.metrics import (TAG_FAMILIES, TAGS, MetricsWriter, check_tag, read_event_scalars, read_metrics,
                                   run_dir)

TAG_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_tag_table_is_documented_and_enforced():
    doc = TAG_DOC.read_text(encoding="utf-8")
    for tag in TAGS:
        assert f"| {tag} " in doc or tag.startswith("policy/"), tag
    for family in TAG_FAMILIES:
        assert f"{family}<" in doc or family == "policy/", family
    assert check_tag("reward/accuracy") == "reward/accuracy"
    with pytest.raises(ValueError, match="unknown metric tag 'train/los'.*train/loss"):
        check_tag("train/los")
    with pytest.raises(ValueError):
        check_tag("reward/")


def test_events_and_jsonl_mirror_and_resume_purge(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in (1, 2, 3):
            w.scalars(step, {"train/loss": 4.0 - step, "reward/accuracy": 0.25 * step})
        w.scalars(4, {"train/loss": float("nan")})
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[1]["train/loss"] == 2.0 and rows[3]["train/loss"] is None
    events = read_event_scalars(tmp_path)
    assert events["train/loss"] == [(1, 3.0), (2, 2.0), (3, 1.0)]       # NaN: a gap in TensorBoard, no warning
    # Resumed from a checkpoint at step 2: steps 3-4 are redone; the old values are dropped in both mirrors.
    with MetricsWriter(tmp_path, resume_step=2) as w:
        w.scalars(3, {"train/loss": 0.5})
    assert [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path)] == [(1, 3.0), (2, 2.0), (3, 0.5)]
    assert read_event_scalars(tmp_path)["train/loss"] == [(1, 3.0), (2, 2.0), (3, 0.5)]
    # Restarted from scratch (killed before its first checkpoint: StageRun resumes at step 0): every step is redone.
    with MetricsWriter(tmp_path, resume_step=0) as w:
        w.scalars(1, {"train/loss": 9.0})
    assert [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path)] == [(1, 9.0)]
    assert read_event_scalars(tmp_path)["train/loss"] == [(1, 9.0)]


def test_run_dir_layout(tmp_path):
    assert run_dir(tmp_path, "table6_both", "sft", 3) == tmp_path / "table6_both" / "sft" / "seed3"
    with pytest.raises(ValueError, match="stage"):
        run_dir(tmp_path, "exp", "a/b", 0)
