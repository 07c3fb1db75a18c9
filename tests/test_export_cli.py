"""`export/to_hf.py` and `export/from_hf.py` end to end (subprocesses) on a micro checkpoint.

to_hf output loads in transformers; from_hf of that output, then to_hf again, gives byte-identical
tensors and config.json and the same `policy_version` in hat_export.json; the drop-in layout keeps the
source's config.json and vision tensors; bad input exits non-zero with a message and writes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from tensor_files import raw_tensors

from hat_jax.export.cli import deployment_generation_config
from hat_jax.model import get_config, params_shapes
from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.model.hf_io import write_safetensors
from hat_jax.model.hf_mapping import HFLayout, params_to_hf

ROOT = Path(__file__).resolve().parents[1]
CONFIG = get_config("micro")
TOKENIZER = {"tokenizer.json": b'{"model": "fake"}\n', "tokenizer_config.json": b'{"model_max_length": 64}\n'}


def run(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "export" / script), *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def _random_params(config, seed=0) -> dict:
    rng = np.random.default_rng(seed)

    def fill(tree):
        return {k: fill(v) if isinstance(v, dict) else jnp.asarray(0.05 * rng.standard_normal(v.shape), jnp.float32)
                for k, v in tree.items()}
    return fill(params_shapes(config))


def _printed_files(stdout: str) -> dict[str, int]:
    """'PATH  N bytes' lines -> {file name: N}."""
    out = {}
    for line in stdout.strip().splitlines():
        path, size = line.rsplit("  ", 1)
        out[Path(path).name] = int(size.removesuffix(" bytes").replace(",", ""))
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt") / "micro"
    params = _random_params(CONFIG)
    save_model_checkpoint(folder, params, CONFIG)
    (folder / "tokenizer").mkdir()
    for name, data in TOKENIZER.items():
        (folder / "tokenizer" / name).write_bytes(data)
    return folder, params


def test_to_hf_from_hf_to_hf_round_trip(ckpt, tmp_path):
    folder, params = ckpt
    hf1, ckpt2, hf2 = tmp_path / "hf1", tmp_path / "ckpt2", tmp_path / "hf2"

    proc = run("to_hf.py", "--ckpt", folder, "--out", hf1)
    assert proc.returncode == 0, proc.stderr
    printed = _printed_files(proc.stdout)
    assert printed == {p.name: p.stat().st_size for p in hf1.iterdir()}
    assert set(printed) == {"model.safetensors", "config.json", "generation_config.json", "hat_export.json", *TOKENIZER}
    assert json.loads((hf1 / "config.json").read_text())["architectures"] == ["Qwen3_5MoeForCausalLM"]
    for name, data in TOKENIZER.items():
        assert (hf1 / name).read_bytes() == data
    assert json.loads((hf1 / "generation_config.json").read_text()) == {
        "do_sample": True, "temperature": 1.0, "top_p": 0.95, "eos_token_id": 2, "pad_token_id": 0}
    tensors = raw_tensors(hf1)
    assert {dtype for dtype, _, _ in tensors.values()} == {"bfloat16"}          # --dtype default
    assert "model.layers.0.mlp.experts.gate_up_proj" in tensors                  # --expert-layout default
    assert "mtp.layers.0.mlp.experts.0.gate_proj.weight" in tensors              # MTP always

    model, info = transformers.AutoModelForCausalLM.from_pretrained(hf1, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert all(k.startswith("mtp.") for k in info["unexpected_keys"])   # transformers ignores mtp.* silently
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(12)[None]).logits).all()

    stale = ckpt2.parent / f".{ckpt2.name}.partial"       # as left by a killed import
    stale.mkdir(parents=True)
    proc = run("from_hf.py", "--hf", hf1, "--out", ckpt2)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()                              # written there, then renamed into place
    assert set(_printed_files(proc.stdout)) == {"params", "model_config.json", *TOKENIZER}
    for name, data in TOKENIZER.items():
        assert (ckpt2 / "tokenizer" / name).read_bytes() == data
    config2, params2 = load_model_checkpoint(ckpt2)
    assert config2.replace(extra=()) == CONFIG
    expected = params_to_hf(params, CONFIG, dtype="bfloat16")
    got = params_to_hf(params2, config2)                                         # on-disk dtype kept (bf16)
    assert all(got[n].dtype == ml_dtypes.bfloat16 and np.array_equal(got[n], expected[n]) for n in expected)

    proc = run("to_hf.py", "--ckpt", ckpt2, "--out", hf2)
    assert proc.returncode == 0, proc.stderr
    assert raw_tensors(hf2) == tensors
    assert (hf2 / "config.json").read_bytes() == (hf1 / "config.json").read_bytes()
    versions = [json.loads((d / "hat_export.json").read_text())["policy_version"] for d in (hf1, hf2)]
    assert versions[0] == versions[1]                     # same tensors and config: same policy version


@pytest.fixture(scope="module")
def vl_source(tmp_path_factory):
    """A VL-layout base folder (per-expert main experts) with vision tensors and its own tokenizer and
    generation config."""
    folder = tmp_path_factory.mktemp("vl_source")
    tensors = params_to_hf(_random_params(CONFIG, 1), CONFIG, HFLayout("model.language_model.", "per_expert"))
    tensors["model.visual.patch_embed.proj.weight"] = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    tensors["model.visual.blocks.0.norm1.weight"] = np.ones(5, ml_dtypes.bfloat16)
    write_safetensors(tensors, folder)
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "text_config": CONFIG.to_hf_dict(), "vision_config": {"depth": 1, "hidden_size": 32},
              "image_token_id": 500}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text('{"temperature": 0.6}')
    (folder / "tokenizer.json").write_text('{"model": "source"}')
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder, tensors


def test_to_hf_dropin_keeps_source_config_and_vision(ckpt, vl_source, tmp_path):
    folder, _ = ckpt
    source, src_tensors = vl_source
    out = tmp_path / "dropin"
    proc = run("to_hf.py", "--ckpt", folder, "--out", out, "--layout", "dropin", "--source", source,
               "--dtype", "float32")
    assert proc.returncode == 0, proc.stderr
    assert (out / "config.json").read_bytes() == (source / "config.json").read_bytes()
    got = raw_tensors(out)
    for name in ("model.visual.patch_embed.proj.weight", "model.visual.blocks.0.norm1.weight"):
        t = src_tensors[name]
        assert got[name] == (str(t.dtype), t.shape, t.tobytes())
    assert "model.language_model.layers.0.mlp.experts.0.gate_proj.weight" in got   # the source's layouts
    assert {d for n, (d, _, _) in got.items() if not n.startswith("model.visual.")} == {"float32"}
    assert json.loads((out / "generation_config.json").read_text())["temperature"] == 1.0  # ours, not the source's
    # The tokenizer comes from one place: the checkpoint's tokenizer folder when it has one.
    assert (out / "tokenizer.json").read_bytes() == TOKENIZER["tokenizer.json"]
    assert not (out / "chat_template.jinja").exists()


def test_to_hf_refuses_non_empty_output_without_force(ckpt, tmp_path):
    folder, _ = ckpt
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run("to_hf.py", "--ckpt", folder, "--out", out)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "not an empty directory" in proc.stderr and "--force" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    proc = run("to_hf.py", "--ckpt", folder, "--out", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.safetensors").exists() and (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("case", ["corrupt_hf", "dropin_without_source", "no_mtp"])
def test_bad_input_exits_nonzero_and_writes_nothing(ckpt, tmp_path, case):
    folder, _ = ckpt
    out = tmp_path / "out"
    if case == "corrupt_hf":
        src = tmp_path / "hf"
        src.mkdir()
        (src / "config.json").write_text(json.dumps(CONFIG.to_hf_dict()))
        (src / "model.safetensors").write_bytes(b"\x00" * 100)
        proc, expected = run("from_hf.py", "--hf", src, "--out", out), "cannot read safetensors file"
    elif case == "dropin_without_source":
        proc, expected = run("to_hf.py", "--ckpt", folder, "--out", out, "--layout", "dropin"), "needs --source"
    else:
        no_mtp = CONFIG.replace(mtp_num_hidden_layers=0)
        save_model_checkpoint(tmp_path / "ckpt", _random_params(no_mtp), no_mtp)
        proc, expected = run("to_hf.py", "--ckpt", tmp_path / "ckpt", "--out", out), "has no MTP block"
    assert proc.returncode == 1 and proc.stdout == ""
    assert expected in proc.stderr, proc.stderr
    assert not out.exists()


def test_generation_config_has_deployment_sampling_and_all_eos_ids():
    gen = deployment_generation_config(get_config("micro", eos_token_id=(2, 5), bos_token_id=1))
    assert gen == {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "bos_token_id": 1, "eos_token_id": [2, 5],
                   "pad_token_id": 0}


def _two_step_run(root: Path) -> None:
    import jax

    from hat_jax.train.checkpoints import StageCheckpointer
    from hat_jax.train.optim import OptimConfig, make_optimizer
    from hat_jax.train.trainer import init_train_state

    tx = make_optimizer(OptimConfig(lr=0.1, total_steps=10))
    checkpointer = StageCheckpointer(root, {"stage": "sft"}, CONFIG, async_save=False)
    for step in (1, 2):
        state = init_train_state(_random_params(CONFIG, seed=step), tx, jax.random.key(step))
        checkpointer.save(step, state.replace(step=jnp.asarray(step, jnp.int32)), None)
    checkpointer.close()


def test_damaged_training_runs_export_the_named_step_or_fail_without_a_traceback(tmp_path):
    run_dir = tmp_path / "run"
    _two_step_run(run_dir)
    (run_dir / "2" / "params" / "_METADATA").unlink()   # step 2 incomplete: step 1 is exported, with a warning
    proc = run("to_hf.py", "--ckpt", run_dir, "--out", tmp_path / "out1")
    assert proc.returncode == 0, proc.stderr
    assert f"exporting checkpoint (step 1): {run_dir}" in proc.stderr
    assert "newer step(s) 2 incomplete or unreadable (step 2: params/_METADATA is missing); using step 1" in proc.stderr
    assert json.loads((tmp_path / "out1" / "hat_export.json").read_text())["step"] == 1

    damaged = tmp_path / "run2"
    _two_step_run(damaged)
    for path in (damaged / "2" / "params" / "ocdbt.process_0" / "d").iterdir():
        path.write_bytes(path.read_bytes()[:100])   # truncated array data: found only when read
    proc = run("to_hf.py", "--ckpt", damaged, "--out", tmp_path / "out2")
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"export/to_hf.py: error: could not read the Orbax params item '{damaged}/2/params'")
    assert f"To resume from step 1, move the damaged step out of the run dir (mv {damaged}/2 " in lines[-1]
    assert "Traceback" not in proc.stderr and "Event loop" not in proc.stderr and len(lines) == 3, proc.stderr
    assert not (tmp_path / "out2").exists()
