"""The scale configs (configs/*.py): each loads a typed Scale, the stage CLIs read the same sections as
experiments/run.py, the base and SFT share one model and tokenizer, and bad config files are named errors."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from hat_jax.experiments.scales import SCALES, Scale, get_scale, with_world_harness
from hat_jax.train.stage import CONFIGS_DIR, load_config, stage_section

SECTIONS = {"sft": "sft", "opd": "opd", "rl": "rl", "opd_live": "opd_live", "base.pretrain": "base.pretrain"}


def _section(scale, path):
    for part in path.split("."):
        scale = getattr(scale, part)
    return scale


def test_every_config_file_is_a_scale_with_its_command():
    assert SCALES == ("micro", "qwen3_6_35b_a3b", "small", "tiny")
    for name in SCALES:
        scale = get_scale(name)
        assert isinstance(scale, Scale) and scale.name == name
        spec = importlib.util.spec_from_file_location("doc", CONFIGS_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert f"--preset {name}" in module.__doc__ and "python " in module.__doc__, name  # the command that runs it


@pytest.mark.parametrize("name", ["micro", "tiny", "small"])
def test_stage_clis_read_the_sections_run_py_uses(name):
    scale = get_scale(name)
    for path in SECTIONS:
        assert stage_section(name, path) == _section(scale, path), (name, path)


def test_schedules_end_at_the_stage_steps():
    for name in SCALES:
        scale = get_scale(name)
        for config in (scale.sft, scale.opd, scale.rl, scale.opd_live, scale.base.pretrain, scale.teacher.sft):
            if config is not None:
                assert config.optim.total_steps is None and config.to_json()["optim"]["total_steps"] == config.updates


@pytest.mark.parametrize("name", ["micro", "tiny", "small"])
def test_the_base_shares_the_sft_model_and_tokenizer(name):
    scale = get_scale(name)
    base, sft = scale.base.pretrain, scale.sft
    assert base.model_config() == sft.model_config()                                # SFT loads the base as its init
    assert (base.world, base.tokenizer_texts) == (sft.world, sft.tokenizer_texts)   # one cached BPE
    assert scale.teacher.sft.model_config().vocab_size == sft.model_config().vocab_size


def test_sections_are_typed():
    micro = get_scale("micro")
    with pytest.raises(ValueError, match=r"Scale\.rl: expected a RLConfig, got OPDConfig"):
        dataclasses.replace(micro, rl=micro.opd)
    with pytest.raises(ValueError, match=r"BaseSpec\.pretrain: expected a PretrainConfig or None, got SFTConfig"):
        dataclasses.replace(micro.base, pretrain=micro.sft)


def test_a_config_file_by_path_and_bad_ones(tmp_path: Path):
    mine = tmp_path / "mine.py"
    mine.write_text((CONFIGS_DIR / "micro.py").read_text().replace("steps=20,", "steps=7,"))
    assert get_scale(str(mine)).sft.steps == 7 and stage_section(str(mine), "sft").steps == 7
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match=r"empty\.py' has no get_config\(\)"):
        load_config(str(tmp_path / "empty.py"))
    (tmp_path / "other.py").write_text("def get_config():\n    return {}\n")
    with pytest.raises(ValueError, match=r"get_config\(\) returned a dict, expected a hat_jax.experiments.scales.Scale"):
        get_scale(str(tmp_path / "other.py"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_scale(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match=r"preset 'micro': its config has no section 'ppo'"):
        stage_section("micro", "ppo")


def test_small_is_tiny_in_the_compact_world_with_a_reading_base_and_longer_sft():
    tiny, small = get_scale("tiny"), get_scale("small")
    # twice 1,000 steps of reading exercises only (a fresh seed each), after a mixed base; tied throughout
    base, reading = small.base.pretrain, small.base.pretrain.init
    mix = reading.init
    assert (mix.steps, mix.reading_share, mix.reading_kinds) == (1200, 0.8, ("label", "copy", "call", "tools", "results"))
    assert base == dataclasses.replace(reading, init=reading, seed=reading.seed + 1)
    assert (reading.steps, reading.reading_share, reading.reading_kinds) == (1000, 1.0, ("copy", "label", "results", "query"))
    assert mix.init is None and mix.tokenizer_split == base.tokenizer_split and mix.world == base.world
    assert mix.reading_vocab and base.reading_vocab and not tiny.base.pretrain.reading_vocab
    assert all((p.lm_head_init, p.tie_lm_head) == ("embedding", True) for p in (mix, reading, base))
    assert (tiny.base.pretrain.lm_head_init, tiny.base.pretrain.tie_lm_head) == ("normal", False)
    assert base.model_config() == tiny.base.pretrain.model_config() and base.digest() != tiny.base.pretrain.digest()
    assert small.sft.steps == 800 and small.sft.data == tiny.sft.data
    assert small.rl.optim.lr == tiny.rl.optim.lr == 1e-4
    assert small.sft.tie_lm_head and not tiny.sft.tie_lm_head  # tied as its base; tiny's base is untied
    assert base.tokenizer_split == small.sft.tokenizer_split == "scripts"
    assert set(small.world_harnesses().values()) == {"compact"} and set(tiny.world_harnesses().values()) == {"production"}
    compact = with_world_harness(tiny, "compact")
    assert (small.opd, small.eval) == (compact.opd, compact.eval)
    assert dataclasses.replace(small.rl, optim=compact.rl.optim) == compact.rl  # RL differs in its lr only


def test_an_sft_model_other_than_the_base_is_refused_after_every_assignment():
    from hat_jax.experiments.scales import apply_scale_overrides

    micro = get_scale("micro")
    both = apply_scale_overrides(micro, ["base.model.hidden_size=96", "sft.model.hidden_size=96"])
    assert both.sft.model_config() == both.base.pretrain.model_config() and both.sft.model_config().hidden_size == 96
    with pytest.raises(ValueError, match=r"Scale 'micro': sft.preset/model_overrides give another model than the "
                                         r"base's \(hidden_size: 96 vs 64; sft vs base\)"):
        apply_scale_overrides(micro, ["sft.model.hidden_size=96"])
    with pytest.raises(ValueError, match=r"\(vocab_size: 512 vs 4096; sft vs base\)"):   # replaces the preset's
        apply_scale_overrides(micro, ['sft.model_overrides=[["hidden_size", 64]]'])
