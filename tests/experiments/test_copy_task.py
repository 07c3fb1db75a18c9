"""experiments/benchmarks/copy_task.py: the span task's rows wrap a name in a frame and copy it after SEP, its mask
covers the copy and EOS only, and both tasks train end to end on the micro preset."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"))
from copy_task import SPAN_OBJECTS, SPAN_WIDTH, main, span_batch  # noqa: E402


def test_span_rows_copy_the_wrapped_name_after_sep():
    ids, mask = span_batch(np.random.default_rng(0), 64, alphabet=50)
    assert ids.shape == mask.shape == (64, SPAN_WIDTH) and ids.dtype == mask.dtype == np.int32
    heads = set()
    for row, m in zip(ids, mask):
        row = [int(t) for t in row if t]
        sep = row.index(7)
        brand, obj = row[sep + 1:sep + 3]
        assert row[0] == 5 and row[-1] == 8 and len(row) == sep + 4
        assert 10 <= brand < 60 and 60 <= obj < 60 + SPAN_OBJECTS  # brand from the alphabet, then an object
        at = row.index(brand)
        assert row[at + 1] == obj and all(t >= 60 + SPAN_OBJECTS for t in row[1:at] + row[at + 2:sep])
        heads.add(at)
        assert np.flatnonzero(m).tolist() == [sep + 1, sep + 2, sep + 3]  # the copy and EOS
    assert heads == {1, 2, 3, 4, 5}  # the name starts after a head of 0-4 filler tokens


@pytest.mark.parametrize("task, lm_head_init", [("copy", "normal"), ("span", "embedding")])
def test_both_tasks_train_on_micro(task, lm_head_init, capsys):
    assert main(["--preset", "micro", "--steps", "2", "--alphabet", "20", "--length", "4", "--batch", "2",
                 "--gdn-out-std", "0.0", "--task", task, "--lm-head-init", lm_head_init]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{task} task: preset micro") and len(lines) == 3
    assert f"lm_head init {lm_head_init}," in lines[0]
    metric = "copy accuracy" if task == "copy" else "first token"
    assert all(f"  {metric} " in line for line in lines[1:]), lines


def test_span_alphabet_beyond_the_vocabulary_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--preset", "micro", "--task", "span", "--alphabet", "100000"])
    assert "--alphabet 100000: the span task needs alphabet + 60 <= vocab_size" in capsys.readouterr().err
