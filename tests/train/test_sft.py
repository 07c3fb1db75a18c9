"""The SFT stage on the micro preset, through its CLI in subprocesses:

- exact resume: an uninterrupted 6-step run versus a run SIGKILLed after its step-2 checkpoint and resumed
  with --resume; final params bit-identical (np.array_equal on every leaf);
- the loss goes down over the run; metrics files carry the documented tags with one row per step;
- bad input: an incompatible or missing --init checkpoint, a config changed between runs, --set errors.
The tokenizer and world data are cached in a module temp dir (HAT_JAX_CACHE) shared by the runs; the JAX
compilation cache (tests/conftest.py) is inherited by the subprocesses.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from hat_jax.model import init_params
from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.train.checkpoints import ConfigMismatchError, IncompatibleCheckpointError, latest_step
from hat_jax.train.metrics import TAGS, read_event_scalars, read_metrics
from hat_jax.train.sft import _initial_params, apply_overrides, run_sft, with_hsa
from hat_jax.train.stage import stage_section

# The micro architecture with a 4,096-token vocabulary (tiny's): the production prompt is then ~930 tokens
# instead of ~2,250 with micro's 512, so rows of 1,280 tokens carry loss tokens (see hat_jax.train.sft).
# 2 rows per step as 2 micro-batches of 1.
RUN = ["--preset", "micro", "--steps", "6", "--hsa", "off", "--no-progress",
       "--set", "ckpt_every=2", "--set", "log_every=1", "--set", "accum_steps=2", "--set", "data.seq_len=1280",
       "--set", "model.vocab_size=4096", "--set", "optim.lr=0.005"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {**os.environ, "HAT_JAX_CACHE": str(tmp_path_factory.mktemp("cache")), "JAX_PLATFORMS": "cpu"}


def sft_cli(out: Path, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hat_jax.train.sft", "--out", str(out), *RUN, *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
    """The uninterrupted run, started in the background (it overlaps with the killed run's startup)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = sft_cli(out, env)
    state = {"done": False}

    def wait() -> Path:
        if not state["done"]:
            assert json.loads(finish(proc).strip().splitlines()[-1])["step"] == 6
            state["done"] = True
        return out

    yield wait
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_killed_run_resumes_bit_identically(reference, tmp_path, env):
    out = tmp_path / "killed"
    proc = sft_cli(out, env)
    deadline = time.time() + 240
    while not (out / "2").is_dir():  # Orbax renames the finished step directory into place
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.time() < deadline, "no step-2 checkpoint"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = latest_step(out)
    assert killed_at in (2, 4), killed_at  # not finished: the resume below has work to do
    finish(sft_cli(out, env, "--resume"))
    assert latest_step(out) == 6
    _, want = load_model_checkpoint(reference())
    _, got = load_model_checkpoint(out)
    leaves = jax.tree_util.tree_leaves_with_path(want)
    assert len(leaves) == len(jax.tree_util.tree_leaves(got))
    for (path, a), b in zip(leaves, jax.tree_util.tree_leaves(got)):
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"{jax.tree_util.keystr(path)} differs after resume"
    # The redone steps replace the killed run's rows: one metrics row per step.
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5, 6]


def test_loss_goes_down_and_metrics_use_the_documented_tags(reference):
    reference_run = reference()
    rows = read_metrics(reference_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    loss = [r["train/loss"] for r in rows]
    assert np.mean(loss[-2:]) < np.mean(loss[:2]) - 0.3, loss
    for tag in ("train/loss", "train/lb_loss", "train/total_loss", "train/grad_norm", "train/lr",
                "train/loss_tokens", "train/tokens_per_s", "moe/expert_load_cv", "data/hsa_share",
                "train/mtp_loss", "moe/mtp_expert_load_cv", "data/slot_fill"):  # the micro preset trains the MTP head (mtp_coef 0.1)
        assert tag in TAGS and tag in rows[-1], tag
    assert all(r["train/mtp_loss"] > 0 for r in rows)
    assert all(r["data/hsa_share"] == 0.0 for r in rows)  # --hsa off: original harness only
    assert all(r["train/loss_tokens"] > 0 for r in rows)
    assert all(0 < r["data/slot_fill"] <= 1 for r in rows)
    events = read_event_scalars(reference_run)
    assert [s for s, _ in events["train/loss"]] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([v for _, v in events["train/loss"]], loss, rtol=1e-6)
    assert {p.name for p in reference_run.iterdir()} >= {"model_config.json", "tokenizer", "stage_config.json",
                                                         "metrics.jsonl", "2", "4", "6"}


def test_changed_config_on_resume_is_refused(reference, env, monkeypatch):
    from hat_jax.train.sft import main

    monkeypatch.setenv("HAT_JAX_CACHE", env["HAT_JAX_CACHE"])
    argv = ["--out", str(reference()), *RUN, "--set", "optim.lr=0.01", "--resume"]
    with pytest.raises(ConfigMismatchError, match=r"/6 was written with another stage config .*"
                                                  r"optim\.lr: checkpoint 0\.005 != now 0\.01"):
        main(argv)


def test_unpacked_checkpoint_resumes_only_with_a_clear_message(tmp_path, env, monkeypatch):
    from hat_jax.data.packing import DataStateFormatError
    from hat_jax.train.sft import main

    monkeypatch.setenv("HAT_JAX_CACHE", env["HAT_JAX_CACHE"])
    out = tmp_path / "unpacked"
    assert main(["--out", str(out), *RUN, "--steps", "2", "--set", "data.pack=false"]) == 0  # one trajectory per row
    with pytest.raises(ConfigMismatchError, match=r"data\.pack: checkpoint False != now True"):
        main(["--out", str(out), *RUN, "--steps", "4", "--resume"])
    with pytest.raises(DataStateFormatError, match=r"SFT data state: the checkpoint's data state has format None "
                                                   r".*this pipeline packs documents.*--set data\.pack=false"):
        main(["--out", str(out), *RUN, "--steps", "4", "--resume", "--force"])


def test_bad_init_checkpoint_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HAT_JAX_CACHE", str(tmp_path / "cache"))
    other = stage_section("micro", "sft").model_config().replace(hidden_size=32)
    save_model_checkpoint(tmp_path / "base", init_params(other, jax.random.key(0)), other)
    config = apply_overrides(stage_section("micro", "sft"), ["steps=2", f"init={tmp_path / 'base'}"])
    with pytest.raises(IncompatibleCheckpointError, match=r"base.*lm_head/kernel has shape \(32, 4096\), "
                                                          r"the stage expects \(64, 4096\)"):
        run_sft(config, tmp_path / "out", progress=False)
    config = apply_overrides(config, [f"init={tmp_path / 'missing'}"])
    with pytest.raises(FileNotFoundError, match="missing"):
        run_sft(config, tmp_path / "out2", progress=False)
    # Same shapes, another architecture setting: named too. A matching checkpoint loads as it is.
    micro = stage_section("micro", "sft").model_config()
    params = init_params(micro, jax.random.key(3))
    save_model_checkpoint(tmp_path / "eps", params, micro.replace(rms_norm_eps=1e-5))
    config = apply_overrides(config, [f"init={tmp_path / 'eps'}"])
    with pytest.raises(IncompatibleCheckpointError, match=r"eps.*another model config: rms_norm_eps: checkpoint 1e-05"):
        run_sft(config, tmp_path / "out3", progress=False)
    save_model_checkpoint(tmp_path / "good", params, micro)
    loaded = _initial_params(apply_overrides(config, [f"init={tmp_path / 'good'}"]), micro)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(params)))


def test_overrides_and_switches():
    config = apply_overrides(stage_section("micro", "sft"), ["data.seq_len=512", "optim.lr=1", "model.vocab_size=1024",
                                                             "data.hsa.default_p=0.25", "init=/some/dir"])
    assert config.data.seq_len == 512 and config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
    assert config.model_config().vocab_size == 1024 and config.data.hsa.default_p == 0.25
    assert config.init == "/some/dir"
    assert with_hsa(config, False).harness_mode == "original" and with_hsa(config, True).harness_mode == "hsa"
    assert config.optim.total_steps is None and config.to_json()["optim"]["total_steps"] == config.steps
    longer = apply_overrides(config, ["steps=7"])  # the schedule ends at the stage's steps
    assert longer.to_json()["optim"]["total_steps"] == 7 and longer.to_json()["optim"]["warmup_steps"] == 2
    assert apply_overrides(config, ["steps=1"]).to_json()["optim"]["warmup_steps"] == 1  # capped at the end
    with pytest.raises(ValueError,
                       match=r"unknown field 'seqlen' of SFTDataConfig \(did you mean 'seq_len'\?\); valid: seq_len"):
        apply_overrides(config, ["data.seqlen=3"])
    with pytest.raises(ValueError, match=r"unknown model field 'vocab' \(did you mean 'vocab_size'\?\)"):
        apply_overrides(config, ["model.vocab=3"])
    with pytest.raises(ValueError, match="accum_steps"):
        apply_overrides(config, ["accum_steps=3"])


def test_tokenizer_split_is_checked_and_keys_the_cached_bpe(tmp_path, monkeypatch):
    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.train import sft as sft_module

    with pytest.raises(ValueError, match=r"SFTConfig.tokenizer_split = 'bytes': expected one of \['chars', 'qwen', 'scripts', 'words'\]"):
        sft_module.SFTConfig(tokenizer_split="bytes")
    monkeypatch.setenv("HAT_JAX_CACHE", str(tmp_path))
    trained = []
    monkeypatch.setattr("hat_jax.tokenizer.train_bpe_tokenizer",
                        lambda texts, vocab, out, split: trained.append(split) or (out / "tokenizer.json").write_text("{}"))
    folders = {split: sft_module.bpe_tokenizer_dir(512, 0, WorldDataConfig(), [], split) for split in ("qwen", "words")}
    assert folders["qwen"] != folders["words"] and trained == ["qwen", "words"]


def test_tied_sft_trains_the_lm_head_as_the_embeddings_transpose_and_refuses_an_untied_init(tmp_path, monkeypatch):
    monkeypatch.setenv("HAT_JAX_CACHE", str(tmp_path / "cache"))
    untied = apply_overrides(stage_section("micro", "sft"), ["steps=2", "ckpt_every=2", "data.seq_len=1280",
                                                             "model.vocab_size=4096", "optim.lr=0.005"])
    # the field names a config only when set: stages and runs from before it keep their hashes
    assert "tie_lm_head" not in untied.to_json() and apply_overrides(untied, ["tie_lm_head=true"]).to_json()["tie_lm_head"]
    with pytest.raises(ValueError, match=r"SFTConfig.tie_lm_head = 'yes': expected true or false"):
        dataclasses.replace(untied, tie_lm_head="yes")
    with pytest.raises(ValueError, match=r"--set tie_lm_head: expected a value of type bool"):
        apply_overrides(untied, ["tie_lm_head=yes"])
    model_config = untied.model_config()
    tied_base = init_params(model_config, jax.random.key(0), lm_head_init="embedding")
    save_model_checkpoint(tmp_path / "tied", tied_base, model_config)
    save_model_checkpoint(tmp_path / "untied", init_params(model_config, jax.random.key(0)), model_config)
    config = apply_overrides(untied, ["tie_lm_head=true", f"init={tmp_path / 'untied'}"])
    with pytest.raises(ValueError, match=r"tie_lm_head = True needs an init whose lm_head equals the embedding's "
                                         r"transpose .* tying would discard its lm_head"):
        run_sft(config, tmp_path / "refused", progress=False)
    with pytest.raises(ValueError, match=r"tie_lm_head = True needs init: a base trained with"):
        run_sft(apply_overrides(untied, ["tie_lm_head=true"]), tmp_path / "fresh", progress=False)
    run_sft(apply_overrides(config, [f"init={tmp_path / 'tied'}"]), tmp_path / "out", progress=False)
    _, trained = load_model_checkpoint(tmp_path / "out")
    embedding = np.asarray(trained["model"]["embed_tokens"]["embedding"])
    np.testing.assert_array_equal(np.asarray(trained["lm_head"]["kernel"]), embedding.T)
    assert not np.array_equal(embedding, np.asarray(tied_base["model"]["embed_tokens"]["embedding"]))
