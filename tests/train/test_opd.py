"""The OPD stage on the micro preset (random micro student and teacher, a BPE tokenizer of micro's 512
tokens trained on the general prompts, which are <= 161 tokens with it):

- the sampled loss through the CLI: an uninterrupted 3-step run (in-process) versus a run SIGKILLed after
  its step-2 checkpoint and resumed with --resume; final params bit-identical; metrics with the documented
  tags, one row per step;
- teacher == student: the sampler's logprobs equal the teacher's (sampled advantage 0) and the exact reverse
  KL and its gradient are 0;
- the exact loss moves the student toward the teacher (KL down over 4 steps on a fixed prompt set);
- gradient accumulation over 2 micro-batches equals the full batch (sampled loss, seq-mean-token-mean, clip);
- the chunked entropy equals the full one; bad input names the checkpoint / field.
Every run uses one set of shapes (4 rows of 192 tokens) so the sampler, teacher and train steps compile once
(tests/conftest.py's persistent cache is shared with the subprocesses).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.data.general import general_prompts, general_response
from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.tokenizer import load_tokenizer, train_bpe_tokenizer
from hat_jax.train.checkpoints import IncompatibleCheckpointError, latest_step
from hat_jax.train.metrics import read_metrics
from hat_jax.train.opd import apply_opd_overrides, main, run_opd
from hat_jax.train.opd_batches import OPDBatches, prompt_pool
from hat_jax.train.losses import token_entropy_chunked
from hat_jax.train.opd_loss import _entropy, opd_loss_fn
from hat_jax.train.optim import make_optimizer
from hat_jax.train.stage import resolved_optim, stage_section
from hat_jax.train.trainer import accumulate_gradients, init_train_state, split_micro_batches

SETS = ["--set", "ckpt_every=2", "--set", "log_every=1"]
TAGS = ("train/loss", "train/grad_norm", "kl/reverse_k1", "kl/reverse_k3", "policy/clip_frac", "policy/entropy",
        "rollout/completion_len", "rollout/finished_frac", "time/generation_s", "time/teacher_s", "time/train_s")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    config = get_config("micro")
    prompts = general_prompts(200, 0, "train")
    texts = [p.prompt for p in prompts] + [general_response(p, random.Random(i)) for i, p in enumerate(prompts)]
    for name, seed in (("student", 0), ("teacher", 1)):
        save_model_checkpoint(root / name, init_params(config, jax.random.key(seed)), config)
        train_bpe_tokenizer(texts, config.vocab_size, root / name / "tokenizer")
    return root


def config_for(ckpts, *sets, teacher="teacher", steps=3):
    config = dataclasses.replace(stage_section("micro", "opd"), steps=steps)
    config = dataclasses.replace(config, init=str(ckpts / "student"),
                                 teacher=None if teacher is None else str(ckpts / teacher))
    return apply_opd_overrides(config, [s for s in sets if s != "--set"])


def cli_args(out: Path, ckpts: Path) -> list[str]:
    return ["--preset", "micro", "--init", str(ckpts / "student"), "--teacher", str(ckpts / "teacher"), "--out",
            str(out), "--steps", "3", "--no-progress", *SETS]


def opd_cli(out: Path, ckpts: Path, env: dict, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hat_jax.train.opd", *cli_args(out, ckpts), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def leaves(params):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]


def test_sampled_run_logs_metrics_and_resumes_bit_identically(ckpts, tmp_path):
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    proc = opd_cli(killed, ckpts, {**os.environ, "JAX_PLATFORMS": "cpu"})
    try:  # watched from the start: killed right after its step-2 checkpoint, before step 3 can finish
        deadline = time.time() + 240
        while not (killed / "2").is_dir():  # Orbax renames the finished step directory into place
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.time() < deadline, "no step-2 checkpoint"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert latest_step(killed) == 2
    state = run_opd(config_for(ckpts, *SETS), reference, progress=False)  # the uninterrupted reference
    assert main([*cli_args(killed, ckpts), "--resume"]) == 0  # resumed in this process (compiled already)
    assert latest_step(killed) == 3 and int(state.step) == 3
    got, want = leaves(load_model_checkpoint(killed)[1]), leaves(load_model_checkpoint(reference)[1])
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert [r["step"] for r in read_metrics(killed)] == [1, 2, 3]

    rows = read_metrics(reference)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for tag in TAGS:
        assert all(np.isfinite(r[tag]) for r in rows), tag
    assert rows[0]["train/loss_tokens"] == 4 * 16 and rows[0]["rollout/completion_len"] == 16
    assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: rho = 1 at the step's start
    np.testing.assert_allclose(rows[0]["train/loss"], rows[0]["kl/reverse_k1"], atol=1e-4)  # -rho*A = k1 at rho 1


EXACT = ("loss=exact", "lb_coef=0", "mtp_coef=0", "optim.lr=0.01", "optim.clip_norm=null", "prompt_pool=2")


def test_exact_kl_is_zero_when_the_teacher_is_the_student(ckpts, tmp_path):
    run_opd(config_for(ckpts, *EXACT, teacher=None, steps=4), tmp_path / "self", progress=False)
    first = read_metrics(tmp_path / "self")[0]
    assert abs(first["kl/reverse_exact"]) < 1e-6 and abs(first["kl/reverse_k1"]) < 1e-4, first
    assert first["train/grad_norm"] < 1e-5, first  # the KL's minimum: zero gradient (lb_coef 0, mtp_coef 0)


def test_exact_loss_moves_the_student_toward_the_teacher(ckpts, tmp_path):
    run_opd(config_for(ckpts, *EXACT, steps=4), tmp_path / "exact", progress=False)
    kl = [r["kl/reverse_exact"] for r in read_metrics(tmp_path / "exact")]
    assert kl[0] > 0.01 and kl[-1] < 0.8 * kl[0], kl  # seen: 0.0251, 0.0218, 0.0201, 0.0177


@pytest.fixture(scope="module")
def batch(ckpts):
    """One step's host batch with teacher == student (sampled loss), and what made it."""
    config = config_for(ckpts, teacher="student")
    model_config, params = load_model_checkpoint(ckpts / "student")
    tokenizer = load_tokenizer(ckpts / "student" / "tokenizer")
    model = Qwen3_5MoeForCausalLM(model_config)
    state = init_train_state(params, make_optimizer(resolved_optim(config)), jax.random.key(0))
    host = OPDBatches(config, model_config, tokenizer, prompt_pool(config, tokenizer), params, model)(state)
    return config, model, params, host


def test_sampler_logprobs_equal_the_teachers_when_the_teacher_is_the_student(batch):
    _, _, _, host = batch
    act = host["action_mask"] == 1
    assert act.sum() == 4 * 16 and host["input_ids"].shape == (4, 192)
    advantage = -(host["old_logprobs"] - host["teacher_logprobs"])  # kl_coef 1
    assert np.abs(advantage[act]).max() < 2e-5
    assert host["stats"]["rollout/completion_len"] == 16


def test_accumulation_equals_the_full_batch(batch):
    config, model, params, host = batch
    config = dataclasses.replace(config, aggregation="seq-mean-token-mean", clip_eps=0.2)
    act = host["action_mask"] == 1
    noise = np.random.default_rng(0).normal(0, 0.3, act.shape).astype(np.float32)
    host = {**host, "old_logprobs": np.where(act, host["old_logprobs"] + noise, 0.0).astype(np.float32),
            "action_mask": np.where(np.arange(192)[None] < (host["prompt_lengths"] + [16, 9, 16, 3])[:, None], act, 0)}
    keys = ("input_ids", "attention_mask", "action_mask", "old_logprobs", "teacher_logprobs")
    grads = jax.jit(lambda p, b: accumulate_gradients(opd_loss_fn(model, config), p, b, jax.random.key(0)))
    g1, s1 = grads(params, split_micro_batches(host, 1, keys))
    g2, s2 = grads(params, split_micro_batches(host, 2, keys))
    assert 0 < s1["policy/clip_frac"] < 1  # both sides of the clip are exercised
    np.testing.assert_allclose(s2["loss"], s1["loss"], rtol=1e-6)
    assert s1["loss_tokens"] == s2["loss_tokens"] == 4  # seq-mean: rows
    for a, b in zip(leaves(g1), leaves(g2)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_chunked_entropy_equals_the_full_one():
    rng = np.random.default_rng(0)
    hidden, kernel = rng.normal(size=(2, 5, 8)).astype(np.float32), rng.normal(size=(8, 37)).astype(np.float32)
    full = _entropy(jnp.asarray(hidden @ kernel), 0.7)
    chunked = token_entropy_chunked(jnp.asarray(hidden), jnp.asarray(kernel), 10, 0.7, jnp.float32)
    np.testing.assert_allclose(chunked, full, rtol=1e-5, atol=1e-6)
    assert float(full[0, 0]) == 0.0


def test_bad_input_is_named(ckpts, tmp_path):
    config = config_for(ckpts)
    with pytest.raises(FileNotFoundError, match="student init checkpoint .*missing"):
        run_opd(dataclasses.replace(config, init=str(tmp_path / "missing")), tmp_path / "a", progress=False)
    wide = get_config("micro", vocab_size=1024)
    save_model_checkpoint(tmp_path / "wide", init_params(wide, jax.random.key(2)), wide)
    with pytest.raises(IncompatibleCheckpointError, match=r"teacher checkpoint .*wide.* vocab_size 1024.*512"):
        run_opd(dataclasses.replace(config, teacher=str(tmp_path / "wide")), tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="init: the student checkpoint is required"):
        run_opd(dataclasses.replace(config, init=None), tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="unknown OPD loss 'kl'; valid: sampled, exact"):
        apply_opd_overrides(config, ["loss=kl"])
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        apply_opd_overrides(config, ["aggregation=mean"])
    with pytest.raises(ValueError, match="model fields cannot be overridden"):
        apply_opd_overrides(config, ["model.vocab_size=1024"])
    with pytest.raises(ValueError, match="multiple of accum_steps"):
        apply_opd_overrides(config, ["accum_steps=3"])
