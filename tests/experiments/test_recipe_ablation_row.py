"""Recipe "add an ablation row": a row is data in an ablations/*.yaml file, and a stage of its chain may set any
field of that stage's config. Exercised here through the public path (the declarations, the scale, the keys
and run configs the runner uses), with a toy file written by the test."""

from pathlib import Path

import pytest

from hat_jax.experiments.chain import chain_keys, stage_config
from hat_jax.experiments.declarations import load_all, resolve
from hat_jax.experiments.runner import check_run_dirs
from hat_jax.experiments.scales import SECTIONS, Scale, apply_scale_overrides, get_scale
from hat_jax.experiments.stage_kinds import STAGE_KINDS

TOY = """\
group: toy
title: "a toy ablation"
columns: [live_qa.avg]
rows:
  - name: toy_plain
    description: "HSA-SFT, then HSA-RL"
    chain: ["sft:hsa", "rl:hsa"]
  - name: toy_gdpo
    description: "the same RL stage with GDPO and a KL term"
    chain: ["sft:hsa", {stage: "rl:hsa", set: {estimator: gdpo, beta: 0.05}}]
  - name: toy_same
    description: "an override equal to the scale's value"
    chain: ["sft:hsa", {stage: "rl:hsa", set: {estimator: grpo}}]
  - name: toy_sft_lr
    description: "SFT at another lr and HSA without rename_tools, then the plain RL stage"
    chain: [{stage: "sft:hsa", set: {optim.lr: 0.01, data.hsa.probs: {rename_tools: 0.0}}}, "rl:hsa"]
"""


@pytest.fixture
def toy(tmp_path: Path):
    (tmp_path / "toy.yaml").write_text(TOY)
    groups = load_all(tmp_path)
    return {row.name: row for row in resolve("toy", groups)[1]}


def test_a_toy_row_loads_and_its_keys_differ_exactly_where_the_override_is(toy, tmp_path):
    scale = get_scale("micro")
    plain, gdpo, same, sft_lr = (chain_keys(scale, toy[n].chain) for n in ("toy_plain", "toy_gdpo", "toy_same",
                                                                             "toy_sft_lr"))
    assert gdpo[0] == plain[0] and gdpo[1] != plain[1]        # the shared SFT prefix trains once
    assert same == plain                                      # an override that changes nothing shares every dir
    assert sft_lr[0] != plain[0] and sft_lr[1] != plain[1]   # a changed stage moves the keys of the stages after it
    rl = stage_config(scale, toy["toy_gdpo"].chain[1], init=tmp_path, seed=2, base=tmp_path, teacher=None)
    assert (rl.estimator, rl.beta, rl.harness_mode, rl.seed) == ("gdpo", 0.05, "hsa", 2)
    sft = stage_config(scale, toy["toy_sft_lr"].chain[0], init=tmp_path, seed=2, base=tmp_path, teacher=None)
    assert sft.optim.lr == 0.01 and sft.data.hsa.probs == {"rename_tools": 0.0} and sft.data.p_hsa == scale.sft.data.p_hsa
    check_run_dirs(list(toy.values()), scale, [0], tmp_path / "runs", resume=False)   # every row resolves


def test_an_override_the_scale_refuses_is_named_before_anything_trains(tmp_path):
    """Valid for the config class (checked at load), not for this scale: 2 tasks x 3 episodes in 4 micro-batches."""
    (tmp_path / "toy.yaml").write_text(TOY.replace("beta: 0.05", "group_size: 3"))
    row = resolve("toy_gdpo", load_all(tmp_path))[1][0]
    scale = apply_scale_overrides(get_scale("micro"), ["rl.accum_steps=4"])
    with pytest.raises(ValueError, match=r"toy_gdpo: stage rl:hsa\[.*\]: RLConfig: tasks_per_step x group_size = 6 "
                                         r"rows must be a multiple of"):
        check_run_dirs([row], scale, [0], tmp_path / "runs", resume=False)


def test_one_table_of_stage_kinds_names_the_scale_sections():
    stage_fields = [f for f in Scale.__dataclass_fields__ if f not in ("name", "base", "teacher", "eval")]
    assert list(STAGE_KINDS) == stage_fields and SECTIONS == ("base", *STAGE_KINDS, "teacher", "eval")
