"""`export/to_hf.py --ckpt` accepts a run dir, a stage dir and an experiment dir, refuses an unfinished stage, a
corrupt checkpoint and a drop-in source of another architecture with messages that name the path, and writes
`hat_export.json` with a deterministic `policy_version` and the MTP acceptance results.json recorded for exactly the
exported checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from export_helpers import CONFIG, MTP_FIGURES, RL, SFT, random_params, write_stage

from hat_jax.export.sources import UnfinishedStageError, recorded_mtp_acceptance, resolve_export_source
from hat_jax.model.checkpoint_io import save_model_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def to_hf(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "export" / "to_hf.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_resolves_run_stage_and_experiment_dirs(runs):
    sft, rl = runs / "stages" / SFT / "seed0", runs / "stages" / RL / "seed0"
    plain = resolve_export_source(sft / "2" / "..")          # any spelling of the run dir
    assert (plain.kind, plain.directory, plain.step, plain.stage, plain.seed) == ("stage", sft, 2, SFT, 0)
    assert plain.stage_record["name"] == "rl"
    grouped = resolve_export_source(runs / "stages" / SFT)   # stages/<chain>-<key>: its lowest seed
    assert grouped.directory == sft and grouped.seed == 0
    exp = resolve_export_source(runs / "table6_both")
    assert (exp.kind, exp.directory, exp.step, exp.experiment, exp.stage, exp.seed) == (
        "experiment", rl, 3, "table6_both", RL, 0)
    assert exp.describe() == f"experiment table6_both, seed 0: its last stage {RL} (step 3): {rl}"


def test_experiment_without_seed_record_uses_the_one_last_stage_dir(runs, tmp_path):
    copy = tmp_path / "runs"                                  # a moved output root, before its evaluation ended
    shutil.copytree(runs / "stages" / RL, copy / "stages" / RL)
    (copy / "table6_both").mkdir()
    shutil.copy(runs / "table6_both" / "run_config.json", copy / "table6_both")
    assert resolve_export_source(copy / "table6_both").directory == copy / "stages" / RL / "seed0"
    shutil.copytree(copy / "stages" / RL, copy / "stages" / "sft-hsa.rl-hsa-ffffffffff")
    with pytest.raises(FileNotFoundError, match=r"2 dirs, not exactly one.*ffffffffff.*pass the stage dir itself"):
        resolve_export_source(copy / "table6_both")
    (copy / "table6_both" / "seed0.json").write_text(json.dumps({"checkpoint": str(runs / "stages" / RL / "seed0")}))
    with pytest.raises(ValueError, match=r"--seed 3: experiment table6_both .* was run with seeds \[0\]"):
        resolve_export_source(copy / "table6_both", seed=3)

    base = tmp_path / "cache" / "base-0123"                   # a row without stages: its checkpoint is the base
    save_model_checkpoint(base, random_params(), CONFIG)
    (copy / "table3_base").mkdir()
    (copy / "table3_base" / "run_config.json").write_text(json.dumps({"experiment": "table3_base", "seeds": [0],
                                                                      "chain": []}))
    (copy / "table3_base" / "seed0.json").write_text(json.dumps({"checkpoint": str(base)}))
    resolved = resolve_export_source(copy / "table3_base")
    assert (resolved.directory, resolved.stage, resolved.step) == (base, "base", None)
    assert resolved.experiment == "table3_base"
    entry = dict(MTP_FIGURES, seed=0, checkpoint=str(base))    # the base row evaluates the base: its figures
    (copy / "table3_base" / "results.json").write_text(json.dumps({"experiment": "table3_base",
                                                                   "mtp": dict(MTP_FIGURES, per_seed=[entry])}))
    assert recorded_mtp_acceptance(resolved) == (
        dict(entry, experiment="table3_base", results=str(copy / "table3_base" / "results.json")), None)


def test_unfinished_stage_is_refused_unless_allowed(runs, tmp_path):
    stage = tmp_path / "stages" / "sft-hsa-9999999999" / "seed1"
    write_stage(stage, random_params(), (1,), None, done=False)
    with pytest.raises(UnfinishedStageError, match=r"unfinished \(no stage_done.json; its latest checkpoint is step 1 "
                                                   r"of 2\).*--resume.*--allow-unfinished"):
        resolve_export_source(stage)
    assert resolve_export_source(stage, allow_unfinished=True).step == 1
    proc = to_hf("--ckpt", stage, "--out", tmp_path / "out")
    assert proc.returncode == 1 and str(stage) in proc.stderr and "unfinished" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_cli_experiment_dir_writes_provenance_and_a_servable_folder(runs, tmp_path):
    import transformers

    out = tmp_path / "hf"
    proc = to_hf("--ckpt", runs / "table6_both", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert f"exporting experiment table6_both, seed 0: its last stage {RL} (step 3)" in proc.stderr
    assert str(out / "hat_export.json") in proc.stdout
    record = json.loads((out / "hat_export.json").read_text())
    assert isinstance(record["policy_version"], str) and len(record["policy_version"]) == 12
    assert {k: record[k] for k in ("source_checkpoint", "step", "experiment", "stage", "seed", "layout", "dtype")} == {
        "source_checkpoint": str(runs / "stages" / RL / "seed0"), "step": 3, "experiment": "table6_both",
        "stage": RL, "seed": 0, "layout": "text", "dtype": "bfloat16"}
    assert record["exported_at"].endswith("+00:00") and "hat_jax_commit" in record
    results = str(runs / "table6_both" / "results.json")
    expected_mtp = dict(MTP_FIGURES, seed=0, checkpoint=str(runs / "stages" / RL / "seed0"), experiment="table6_both",
                        results=results)
    assert record["mtp_acceptance"] == expected_mtp and record["mtp_acceptance_reason"] is None
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3_5MoeForCausalLM"]
    tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    chat = tok.apply_chat_template([{"role": "user", "content": "这款口红多少钱？"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat.startswith("<|im_start|>user\n这款口红多少钱？<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(tok("这款口红多少钱？")["input_ids"]) == "这款口红多少钱？"

    # Deterministic: the same checkpoint and options give the same version; other weights another one.
    again, other = tmp_path / "again", tmp_path / "other"
    assert to_hf("--ckpt", runs / "stages" / RL / "seed0", "--out", again).returncode == 0
    again_record = json.loads((again / "hat_export.json").read_text())
    assert again_record["policy_version"] == record["policy_version"]
    assert again_record["mtp_acceptance"] == expected_mtp          # the stage dir: found in DIR/*/results.json
    assert to_hf("--ckpt", runs / "stages" / SFT, "--out", other).returncode == 0
    other_record = json.loads((other / "hat_export.json").read_text())
    assert other_record["policy_version"] != record["policy_version"]
    assert other_record["mtp_acceptance"] is None                  # the SFT stage: no experiment ends there
    assert other_record["mtp_acceptance_reason"] == (
        f"{results} holds no MTP acceptance of seed 0 of {runs / 'stages' / SFT / 'seed0'} (measured by the evaluation "
        "only when the model has an MTP block and eval.mtp_items > 0)")


def test_mtp_acceptance_only_of_the_exported_checkpoint(runs, tmp_path):
    copy, gone = tmp_path / "runs", str(tmp_path / "gone" / "stages" / RL / "seed0")
    shutil.copytree(runs / "stages" / RL, copy / "stages" / RL)  # a moved output root: its recorded paths are gone
    shutil.copytree(runs / "table6_both", copy / "table6_both")
    data = json.loads((copy / "table6_both" / "results.json").read_text())
    data["mtp"]["per_seed"][0]["checkpoint"] = gone
    (copy / "table6_both" / "results.json").write_text(json.dumps(data))
    (copy / "table6_both" / "seed0.json").write_text(json.dumps({"seed": 0, "checkpoint": gone}))
    source = resolve_export_source(copy / "table6_both")
    assert source.directory == copy / "stages" / RL / "seed0"
    got, reason = recorded_mtp_acceptance(source)             # the same <chain>-<key>/seed0: its figures
    assert reason is None and got == dict(MTP_FIGURES, seed=0, checkpoint=gone, experiment="table6_both",
                                          results=str(copy / "table6_both" / "results.json"))
    data["mtp"]["per_seed"][0]["seed"] = 1                     # figures of another seed's checkpoint
    (copy / "table6_both" / "results.json").write_text(json.dumps(data))
    got, reason = recorded_mtp_acceptance(resolve_export_source(copy / "table6_both"))
    assert got is None and "holds no MTP acceptance of seed 0" in reason
    (copy / "table6_both" / "results.json").write_text(json.dumps({"experiment": "table6_both", "mtp": None}))
    assert recorded_mtp_acceptance(resolve_export_source(copy / "table6_both"))[0] is None
    (copy / "table6_both" / "results.json").unlink()
    got, reason = recorded_mtp_acceptance(resolve_export_source(copy / "table6_both"))
    assert got is None and reason.startswith("no results.json found for")
    plain = resolve_export_source(save_model_checkpoint(tmp_path / "ckpt", random_params(), CONFIG))
    got, reason = recorded_mtp_acceptance(plain)
    assert got is None and "not an experiment or stage dir" in reason and "mtp_acceptance.py --ckpt" in reason
    stage = tmp_path / "stages" / "sft-hsa-9999999999" / "seed0"
    write_stage(stage, random_params(), (1,), None, done=False)
    got, reason = recorded_mtp_acceptance(resolve_export_source(stage, allow_unfinished=True))
    assert got is None and "is unfinished" in reason


@pytest.mark.parametrize("case", ["missing", "outputs_root", "corrupt_params", "dropin_mismatch"])
def test_bad_checkpoints_are_named(runs, tmp_path, case):
    out, extra = tmp_path / "out", []
    if case == "missing":
        ckpt, expected = tmp_path / "nope", [f"--ckpt {tmp_path / 'nope'} does not exist", "experiment dir"]
    elif case == "outputs_root":
        ckpt, expected = runs, ["looks like an experiments output root", str(runs / "table6_both")]
    elif case == "corrupt_params":
        ckpt = tmp_path / "stages" / SFT / "seed0"
        shutil.copytree(runs / "stages" / SFT / "seed0", ckpt)
        for f in (ckpt / "2" / "params").rglob("*"):
            if f.is_file() and f.name != "_METADATA":
                f.write_bytes(b"garbage")
        expected = ["could not read the Orbax params item", str(ckpt / "2" / "params")]
    else:
        ckpt = runs / "table6_both"
        source = tmp_path / "base"
        source.mkdir()
        other = CONFIG.replace(hidden_size=96, num_experts=4)
        (source / "config.json").write_text(json.dumps(other.to_hf_dict()))
        extra = ["--layout", "dropin", "--source", source]
        expected = ["does not match the drop-in source", "hidden_size: 64 vs 96", "num_experts: 8 vs 4",
                    str(runs / "stages" / RL / "seed0" / "model_config.json")]
    proc = to_hf("--ckpt", ckpt, "--out", out, *extra)
    assert proc.returncode == 1 and proc.stdout == ""
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert not out.exists()
