"""The stage scaffolding shared by SFT, OPD and RL: --set overrides, run-dir checks, the CLI's exits."""

import jax
import pytest

from hat_jax.train import stage


def test_set_values_must_match_the_field_type():
    config = stage.stage_section("micro", "sft")
    assert stage.apply_overrides(config, ["optim.lr=1"]).optim.lr == 1.0  # an int for a float field
    assert stage.apply_overrides(config, ["data.p_hsa=0"]).data.p_hsa == 0.0
    with pytest.raises(ValueError, match=r"--set optim.lr: expected a value of type float, got 'abc'"):
        stage.apply_overrides(config, ["optim.lr=abc"])
    with pytest.raises(ValueError, match=r"--set steps: expected a value of type int, got '2.5'"):
        stage.apply_overrides(config, ["steps=2.5"])
    with pytest.raises(ValueError, match=r"--set steps: expected a value of type int, got 'true'"):
        stage.apply_overrides(config, ["steps=true"])
    with pytest.raises(ValueError, match=r"--set model.hidden_size: expected a value of type int"):
        stage.apply_overrides(config, ["model.hidden_size=wide"])


def test_a_tuple_field_takes_json_or_a_bare_comma_separated_list():
    current = ("live_qa", "variant_qa")
    for text in ('["live_qa","ifeval"]', "[live_qa, ifeval]", "live_qa,ifeval", "(live_qa,'ifeval')"):
        assert stage.parse_value(text, current) == ("live_qa", "ifeval"), text
    assert stage.parse_value("live_qa", current) == ("live_qa",)
    assert stage.parse_value('"live_qa"', current) == ("live_qa",)  # a JSON string too
    assert stage.parse_value("[]", current) == ()
    assert stage.parse_value("live_qa", "variant_qa") == "live_qa"  # a string field keeps the string


def test_model_overrides_are_checked_when_the_config_is_built():
    config = stage.stage_section("micro", "sft")
    wider = stage.apply_overrides(config, ['model_overrides=[["hidden_size", 128]]'])
    assert dict(wider.model_overrides) == {"hidden_size": 128} and wider.model_config().hidden_size == 128
    assert stage.apply_overrides(config, ["model.hidden_size=128"]).model_config().hidden_size == 128
    for text, why in (("model_overrides=foo", r"SFTConfig.model_overrides = \('foo',\): expected \(\(field, value\)"),
                      ('model_overrides=[["hidden_sz", 64]]', r"model_overrides = \(\('hidden_sz', 64\),\): unknown "
                                                              r"config field 'hidden_sz'"),
                      ('model_overrides=[["hidden_size", "x"]]', r"config field hidden_size: expected a positive"),
                      ('model_overrides=[["hidden_size", 64], ["hidden_size", 96]]', "a field is given twice"),
                      ('model_overrides=[["rope_parameters", 5]]', r"\(\('rope_parameters', 5\),\): AttributeError")):
        with pytest.raises(ValueError, match=why):
            stage.apply_overrides(config, [text])
    with pytest.raises(ValueError, match=r"PretrainConfig.model_overrides = \('foo',\)"):
        stage.apply_overrides(stage.stage_section("micro", "base.pretrain"), ["model_overrides=foo"])


def test_out_dir_that_is_a_file_is_named(tmp_path):
    path = tmp_path / "afile"
    path.write_text("x")
    with pytest.raises(FileExistsError, match="is a file, not a run directory"):
        stage.StageRun("sft", path, {})


@pytest.mark.parametrize("exc, code", [(KeyboardInterrupt(), 130), (ValueError("bad"), 2)])
def test_cli_exit_codes(exc, code, capsys):
    def main():
        raise exc

    with pytest.raises(SystemExit) as info:
        stage.cli(main)
    assert info.value.code == code
    err = capsys.readouterr().err
    assert ("--resume" in err) if code == 130 else ("error: ValueError: bad" in err)


def test_compile_cache_defaults_under_the_cache_root_and_keeps_a_set_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HAT_JAX_CACHE", str(tmp_path / "root"))
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        with pytest.raises(SystemExit) as info:
            stage.cli(lambda: 0, compile_cache=True)
        assert info.value.code == 0
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "root" / "jax")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
        stage.enable_compile_cache()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
