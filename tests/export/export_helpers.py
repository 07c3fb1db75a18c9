"""Helpers of tests/export: an experiments output root as `experiments/run.py` leaves it, built directly
(no training) on `micro` (the `runs` fixture in conftest.py):

    runs/stages/sft-hsa-0123456789/seed0/          StageCheckpointer steps 1 and 2, stage_done.json, tokenizer/
    runs/stages/sft-hsa.rl-hsa-abcdef0123/seed0/   StageCheckpointer step 3, stage_done.json, tokenizer/
    runs/table6_both/                              run_config.json + seed0.json naming the rl stage dir,
                                                   results.json with the rl stage's MTP acceptance (`MTP_FIGURES`)

Parameters: `params_shapes(micro)` filled with N(0, 0.05), except the output head N(0, 0.5) so that the
greedy argmax has margins far above fp32 rounding (1e-5) and free-running greedy tokens are comparable.
The tokenizer is the project's byte-level BPE (with its chat template) trained on a few sentences.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model import get_config, params_shapes

CONFIG = get_config("micro")
SFT, RL = "sft-hsa-0123456789", "sft-hsa.rl-hsa-abcdef0123"
MTP_FIGURES = {"acceptance_depth1": 0.375, "mean_accepted_length": 1.375, "positions": 48, "episodes": 2}
TEXTS = ["这款口红多少钱？今天直播间有优惠。", "hello there, the price is 99 yuan",
         "有没有适合油皮的粉底液？"] * 4


def random_params(config=CONFIG, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def fill(tree, path=()):
        out = {}
        for k, v in tree.items():
            if isinstance(v, dict):
                out[k] = fill(v, path + (k,))
            else:
                scale = 0.5 if path[:1] == ("lm_head",) else 0.05
                out[k] = jnp.asarray(scale * rng.standard_normal(v.shape), jnp.float32)
        return out
    return fill(params_shapes(config))


def write_stage(directory: Path, params: dict, steps: tuple[int, ...], tokenizer: Path | None, done: bool = True):
    """A StageCheckpointer run dir with the given steps (params + Adam state), the stage files around it."""
    from hat_jax.train.checkpoints import StageCheckpointer
    from hat_jax.train.optim import OptimConfig, make_optimizer
    from hat_jax.train.trainer import TrainState

    tx = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10))
    checkpointer = StageCheckpointer(directory, {"stage": "test", "steps": max(steps) + 1}, CONFIG, async_save=False)
    for step in steps:
        state = TrainState(params, tx.init(params), jnp.asarray(step, jnp.int32), jax.random.key(step))
        checkpointer.save(step, state)
    checkpointer.close()
    (directory / "stage_config.json").write_text(json.dumps({"steps": max(steps) + 1}))
    if tokenizer is not None:
        import shutil

        shutil.copytree(tokenizer, directory / "tokenizer")
    if done:
        (directory / "stage_done.json").write_text(json.dumps({"name": "rl", "harness": "hsa", "steps": max(steps)}))
