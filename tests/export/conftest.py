"""Fixtures of tests/export (see `export_helpers`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from export_helpers import CONFIG, MTP_FIGURES, RL, SFT, TEXTS, random_params, write_stage


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from hat_jax.tokenizer import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_bpe_tokenizer(TEXTS, CONFIG.vocab_size, out, min_frequency=1)
    return out


@pytest.fixture(scope="session")
def runs(tmp_path_factory, tokenizer_dir) -> Path:
    """The output root of the module docstring; the rl stage (the experiment's last) holds `random_params(seed=1)`;
    table6_both's results.json holds `MTP_FIGURES` for it."""
    root = tmp_path_factory.mktemp("runs")
    write_stage(root / "stages" / SFT / "seed0", random_params(seed=0), (1, 2), tokenizer_dir)
    write_stage(root / "stages" / RL / "seed0", random_params(seed=1), (3,), tokenizer_dir)
    exp = root / "table6_both"
    exp.mkdir()
    (exp / "run_config.json").write_text(json.dumps({"experiment": "table6_both", "seeds": [0],
                                                     "chain": ["sft:hsa", "rl:hsa"], "preset": "micro"}))
    (exp / "seed0.json").write_text(json.dumps({"seed": 0, "checkpoint": str(root / "stages" / RL / "seed0")}))
    # the evaluation's MTP figures of that checkpoint, as `hat_jax.experiments.results.mtp_summary` writes them
    (exp / "results.json").write_text(json.dumps({"experiment": "table6_both", "mtp": dict(
        MTP_FIGURES, per_seed=[dict(MTP_FIGURES, seed=0, checkpoint=str(root / "stages" / RL / "seed0"))])}))
    return root
