"""Chain keys: shared prefixes share run dirs, any config change gives new keys; scale overrides name bad fields."""

import dataclasses

import pytest

from hat_jax.experiments.chain import base_key, chain_keys, stage_config, teacher_key
from hat_jax.experiments.declarations import load_all, resolve
from hat_jax.experiments.scales import apply_scale_overrides, get_scale


def _chain(name):
    return resolve(name, load_all())[1][0].chain


def test_rows_sharing_a_prefix_share_its_keys():
    scale = get_scale("micro")
    hat = chain_keys(scale, _chain("table4_hsa_rl_hsa"))
    assert chain_keys(scale, _chain("table3_hat")) == hat                   # same chain, same stage dirs
    assert chain_keys(scale, _chain("table4_hsa_opd")) == hat[:2]           # its prefix
    assert chain_keys(scale, _chain("table6_both"))[0] == hat[0]            # HSA-SFT shared with Table 6
    original = chain_keys(scale, _chain("table4_hsa_rl_original"))
    assert original[:2] == hat[:2] and original[2] != hat[2]                # RL harness differs
    assert chain_keys(scale, _chain("table6_standard"))[0] != hat[0]        # SFT on the original harness
    assert len(set(hat)) == 3


def test_any_override_changes_the_keys_from_its_stage_on():
    scale = get_scale("micro")
    keys = chain_keys(scale, _chain("table4_hsa_rl_hsa"))
    rl = chain_keys(apply_scale_overrides(scale, ["rl.group_size=4"]), _chain("table4_hsa_rl_hsa"))
    assert rl[:2] == keys[:2] and rl[2] != keys[2]
    sft = chain_keys(apply_scale_overrides(scale, ["sft.optim.lr=0.01"]), _chain("table4_hsa_rl_hsa"))
    assert all(a != b for a, b in zip(sft, keys))
    based = apply_scale_overrides(scale, ["base.steps=5"])
    assert base_key(based) != base_key(scale) and chain_keys(based, _chain("table6_both"))[0] != keys[0]
    assert teacher_key(based) != teacher_key(scale)


def test_the_base_key_is_the_bases_own_name():
    """It changes with the base's seed and with the phase it continues (neither is part of a stage's own key), and
    not with fields that shape no chat (the reading kinds of a base without reading exercises)."""
    scale = get_scale("micro")

    def with_base(**fields):
        pretrain = dataclasses.replace(scale.base.pretrain, **fields)
        return dataclasses.replace(scale, base=dataclasses.replace(scale.base, pretrain=pretrain))

    assert scale.base.pretrain.reading_share == 0
    assert base_key(with_base(seed=scale.base.pretrain.seed + 1)) != base_key(scale)
    assert base_key(with_base(init=scale.base.pretrain)) != base_key(scale)
    assert base_key(with_base(reading_kinds=("copy",))) == base_key(scale)


def test_stage_configs_follow_the_chain(tmp_path):
    scale = get_scale("micro")
    sft_hsa, rl_hsa = _chain("table6_both")
    config = stage_config(scale, sft_hsa, init=tmp_path / "base", seed=3, base=tmp_path / "base", teacher=None)
    assert config.data.p_hsa > 0 and config.init == str(tmp_path / "base") and config.seed == 3
    assert config.data.seed == 3  # the seed reaches SFT's record order and HSA draws
    sft_original = _chain("table6_standard")[0]
    assert stage_config(scale, sft_original, init=tmp_path, seed=0, base=tmp_path, teacher=None).data.p_hsa == 0
    config = stage_config(scale, rl_hsa, init=tmp_path / "sft", seed=0, base=tmp_path, teacher=None)
    assert config.harness_mode == "hsa" and config.init == str(tmp_path / "sft")
    opd = _chain("table4_hsa_opd")[1]
    config = stage_config(scale, opd, init=tmp_path / "sft", seed=0, base=tmp_path / "base", teacher=None)
    assert config.teacher == str(tmp_path / "base") and config.prompts == "general"
    live = _chain("table5_distill_hsa")[2]
    config = stage_config(scale, live, init=tmp_path / "opd", seed=0, base=tmp_path, teacher=tmp_path / "t")
    assert config.prompts == "live" and config.harness_mode == "hsa" and config.teacher == str(tmp_path / "t")


def test_world_harness_override_reaches_every_world():
    scale = get_scale("micro")
    out = apply_scale_overrides(scale, ["world.harness=compact"])
    worlds = [out.base.pretrain.world, out.sft.world, out.rl.world, out.opd.world, out.opd_live.world,
              out.teacher.sft.world, out.eval.world]
    assert {w.harness for w in worlds} == {"compact"}
    assert out.eval.world == dataclasses.replace(scale.eval.world, harness="compact")  # nothing else moves
    with pytest.raises(ValueError, match=r"--set 'world.harness=nope': .*harness 'nope': expected a shipped harness "
                                         r"\(compact, production\)"):
        apply_scale_overrides(scale, ["world.harness=nope"])
    with pytest.raises(ValueError, match=r"the world section takes only harness .*e.g. eval.world.eval_items=200"):
        apply_scale_overrides(scale, ["world.eval_items=5"])
    # one section's world alone would train on one harness and evaluate on another: refused, in either order
    for items in (["world.harness=compact", "sft.world.harness=production"], ["sft.world.harness=compact"]):
        with pytest.raises(ValueError, match=r"the sections' worlds name different harnesses \(base: \w+, sft: "):
            apply_scale_overrides(scale, items)


def test_scale_overrides():
    scale = get_scale("micro")
    out = apply_scale_overrides(scale, ["sft.steps=7", "eval.world.eval_items=5", "rl.estimator=gdpo"])
    assert out.sft.steps == 7 and out.sft.to_json()["optim"]["total_steps"] == 7     # the schedule moves too
    assert out.eval.world.eval_items == 5 and out.rl.estimator == "gdpo"
    assert apply_scale_overrides(scale, ["base.hf_path=/x"]).base.pretrain is None
    with pytest.raises(ValueError, match="unknown section 'sftt'.*did you mean 'sft'"):
        apply_scale_overrides(scale, ["sftt.steps=3"])
    with pytest.raises(ValueError, match=r"unknown field 'stepz' of SFTConfig \(did you mean 'steps'\?\); valid: "):
        apply_scale_overrides(scale, ["sft.stepz=3"])
    with pytest.raises(ValueError, match="expected a value of type int"):
        apply_scale_overrides(scale, ["rl.group_size=big"])
    with pytest.raises(ValueError, match=r"'rl' is a section; name a field of it, as rl.field=value"):
        apply_scale_overrides(scale, ["rl=3"])
    for bad, message in (("abc", "rl.steps: expected a value of type int, got 'abc'"),
                         ("1.5", "rl.steps: expected a value of type int, got '1.5'"),
                         ("0", "RLConfig.steps = 0: expected an integer >= 1"),
                         ("-1", "RLConfig.steps = -1: expected an integer >= 1")):
        with pytest.raises(ValueError, match=rf"--set 'rl.steps={bad}': {message}"):
            apply_scale_overrides(scale, [f"rl.steps={bad}"])
    # Fields the chain sets would be silently overwritten: refused, naming who sets them
    for item, how in [("rl.seed=5", "--seeds"), ("sft.data.seed=7", "--seeds"), ("rl.init=/x", "--set base"),
                      ("rl.ref=/x", "--exp"), ("rl.harness_mode=original", "--exp"),
                      ("opd_live.teacher=/t", "--set teacher.path=DIR")]:
        with pytest.raises(ValueError, match=f"is set by the experiment chain: .*choose .*{how}|give .*{how}"):
            apply_scale_overrides(scale, [item])
    with pytest.raises(ValueError, match=r"unknown preset 'tinny' \(did you mean 'tiny'\?\); valid presets: "):
        get_scale("tinny")
    real = get_scale("qwen3_6_35b_a3b")
    assert real.base.pretrain is None and dataclasses.replace(real.sft).preset == "qwen3_6_35b_a3b"


def test_a_failed_start_does_not_block_the_corrected_command(tmp_path):
    from hat_jax.experiments.runner import RunConfigMismatchError, check_run_dir

    exp_dir = tmp_path / "table3_hat"
    exp_dir.mkdir()
    (exp_dir / "run_config.json").write_text('{"experiment": "table3_hat", "scale": {"base": {"hf_path": null}}}')
    fixed = {"experiment": "table3_hat", "scale": {"base": {"hf_path": "/ckpt"}}}
    check_run_dir(exp_dir, fixed, resume=False)        # no seed finished: taken over, with or without --resume
    check_run_dir(exp_dir, fixed, resume=True)
    (exp_dir / "seed0.json").write_text("{}")          # once a seed finished, the run dir is protected
    with pytest.raises(FileExistsError, match="pass --resume"):
        check_run_dir(exp_dir, fixed, resume=False)
    with pytest.raises(RunConfigMismatchError, match=r"scale.base.hf_path: stored None != now '/ckpt'"):
        check_run_dir(exp_dir, fixed, resume=True)


def test_fields_that_break_a_stage_are_refused_when_parsed():
    """Each refused before anything trains, naming the field and the expectation."""
    scale = get_scale("micro")
    cases = [
        ("rl.optim.lr=1e39", r"rl.optim.lr: expected a finite number within float32's range"),
        ("sft.optim.lr=NaN", r"sft.optim.lr: expected a finite number within float32's range"),
        ("sft.optim.lr=nan", r"sft.optim.lr: expected a finite number within float32's range"),
        ("sft.optim.lr=-inf", r"sft.optim.lr: expected a finite number within float32's range"),
        ("sft.optim.lr=Infinity", r"sft.optim.lr: expected a finite number"),
        ("sft.optim.lr=1e6", r"OptimConfig.lr = 1000000.0: expected a finite number in \[0, 1\]"),
        ("rl.optim.lr=-0.1", r"OptimConfig.lr = -0.1: expected a finite number in \[0, 1\]"),
        ("sft.optim.b2=1.5", r"OptimConfig.b2 = 1.5: expected a finite number in \[0, 1\]"),
        ("sft.optim.clip_norm=-1", r"OptimConfig.clip_norm = -1.0: expected null or a finite number >= 0"),
        ("sft.max_to_keep=0", r"SFTConfig.max_to_keep = 0: expected an integer >= 1"),
        ("rl.max_to_keep=-2", r"RLConfig.max_to_keep = -2: expected an integer >= 1"),
        ("sft.ckpt_every=0", r"SFTConfig.ckpt_every = 0: expected an integer >= 1"),
        ("sft.log_every=-1", r"SFTConfig.log_every = -1: expected an integer >= 1"),
        ("opd.ckpt_every=0", r"OPDConfig.ckpt_every = 0: expected an integer >= 1"),
        ("sft.world=3", r"sft.world: 'world' is a section \(WorldDataConfig\), not a value; set one of its fields "
                        r"instead, one --set per field \(fields: .*eval_items"),
    ]
    for item, message in cases:
        with pytest.raises(ValueError, match=message):
            apply_scale_overrides(scale, [item])
    assert apply_scale_overrides(scale, ["sft.optim.lr=0.5"]).sft.optim.lr == 0.5


def test_seeds_with_an_empty_item_are_refused():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("run_cli", Path(__file__).parents[2] / "experiments" / "run.py")
    run_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_cli)
    assert run_cli.parse_seeds("0,1") == [0, 1] and run_cli.parse_seeds(" 2 ") == [2]
    for bad in ("0,,1", "0,", ",1", ""):
        with pytest.raises(ValueError, match=r"--seeds .*: expected comma-separated integers"):
            run_cli.parse_seeds(bad)


def test_stage_done_needs_a_readable_final_checkpoint(tmp_path, monkeypatch):
    """stage_done.json is written only when the final step is complete; a done stage whose final step was damaged
    since is refused with the recovery, not reused."""
    import jax
    import jax.numpy as jnp

    from hat_jax.experiments import chain
    from hat_jax.model.checkpoint_steps import DamagedCheckpointError
    from hat_jax.train.checkpoints import StageCheckpointer
    from hat_jax.train.optim import OptimConfig, make_optimizer
    from hat_jax.train.trainer import init_train_state

    tx = make_optimizer(OptimConfig(lr=0.1, total_steps=10))

    def fake_stage(steps):
        def run(kind, config, out, progress):
            checkpointer = StageCheckpointer(out, {"k": 1}, async_save=False)
            state = init_train_state({"w": jnp.ones(2)}, tx, jax.random.key(0))
            for step in steps:
                checkpointer.save(step, state.replace(step=jnp.asarray(step, jnp.int32)), None)
            checkpointer.close()
        return run

    config = dataclasses.replace(get_scale("micro").sft, steps=2)
    monkeypatch.setattr(chain, "_run_stage", fake_stage([]))   # a stage that wrote no checkpoint
    with pytest.raises(DamagedCheckpointError, match=r"is done training but its final checkpoint is not readable: "
                                                     r"it holds no checkpoint step"):
        chain.run_stage_cached("sft", config, tmp_path / "a", {})
    assert not (tmp_path / "a" / chain.DONE_FILE).exists()

    monkeypatch.setattr(chain, "_run_stage", fake_stage([1, 2]))
    record = chain.run_stage_cached("sft", config, tmp_path / "b", {"name": "sft"})
    assert record["steps"] == 2 and (tmp_path / "b" / chain.DONE_FILE).is_file()
    (tmp_path / "b" / "2" / "params" / "_METADATA").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"is marked finished \(stage_done.json\) but its final checkpoint "
                                                     r"is not readable: .*step 2: params/_METADATA is missing.*using "
                                                     r"step 1. To resume from step 1, move the damaged step out of the "
                                                     r"run dir \(mv .*/b/2 .*b.step2.damaged && mv .*/b/stage_done.json"):
        chain.run_stage_cached("sft", config, tmp_path / "b", {"name": "sft"})
