"""On-policy distillation in the live-stream environment (hat_jax.train.opd, prompts="live") on micro.

The student is the micro architecture with a 4,096-token vocabulary and a BPE trained on the production
harness and oracle episodes (production prompt ~880 tokens), eos-biased as in tests/train/test_rl.py so that
turns end with `<|im_end|>` now and then; the teacher is a wider micro model (hidden 96 instead of 64) with the
same tokenizer.

- the action mask is 1 exactly on the sampled turns: a scripted sampler writes the oracle's turns of plain
  (tool-using) episodes, so the environment's tool responses sit between them; both losses are unchanged when
  the teacher's values at environment positions are perturbed;
- a step is a function of (seed, step) and the params: two fresh batch sources give identical batches under
  HSA harnesses, whose tasks and harness variants are the RL stage's draws at that (seed, step);
- bad live settings are named (a seq_len below the prompt, thinking off, an unknown harness mode);
- the CLI end to end: 2 steps with the larger teacher, a run SIGKILLed after its step-1 checkpoint and resumed
  ends with the same params and the same metrics as an uninterrupted run; every documented tag is logged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from process_helpers import sigkill_when_dir_appears
from hat_jax.data.world_data import rl_tasks
from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.rollout.turns import decode
from hat_jax.train.checkpoints import latest_step
from hat_jax.train.metrics import check_tag, read_metrics
from hat_jax.train.opd import apply_opd_overrides, main, run_opd
from hat_jax.train.opd_batches import EXACT_KEYS, LiveTasks, OPDBatches, live_pool
from hat_jax.train.opd_loss import opd_loss_fn
from hat_jax.train.rl import RLConfig, step_harnesses, step_task_indices
from hat_jax.train.stage import stage_section

VOCAB = 4096
SETS = ["seq_len=1024", "bucket=1024", "log_every=1", "ckpt_every=1"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("HAT_JAX_CACHE", str(path))  # the subprocess inherits it
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def oracle(world, harness):
    from hat_jax.sim.env import LiveStreamEnv
    from hat_jax.sim.oracle import OracleTeacher
    from hat_jax.sim.rollout import rollout
    from hat_jax.sim.viewers import sample_tasks

    env = stage_section("micro", "opd_live").env  # the stage's faults: the scripted episodes face the same ones
    return [rollout(LiveStreamEnv(world, env), OracleTeacher(world), t, harness) for t in sample_tasks(world, 12, 1)]


@pytest.fixture(scope="module")
def made(tmp_path_factory, cache, harness, oracle):
    """(root, (student config, params, teacher config, params, tokenizer)): root holds student/ (eos-biased
    micro, vocab 4096, tokenizer/) and teacher/ (hidden 96, the same tokenizer)."""
    from hat_jax.harness.render import render_system_prompt, render_text
    from hat_jax.tokenizer import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("ckpts")
    base = [render_system_prompt(harness), *(json.dumps(t, ensure_ascii=False) for t in harness.openai_tools()),
            *(s.body for s in harness.skills)]
    first = train_bpe_tokenizer(base, 300, root / "bpe0")
    tokenizer = train_bpe_tokenizer(base + [render_text(first, harness, list(e.messages)) for e in oracle], VOCAB,
                                    root / "student" / "tokenizer")
    config = get_config("micro", vocab_size=VOCAB)
    p = init_params(config, jax.random.key(0))
    kernel = (p["lm_head"]["kernel"] * 10.0).at[0, :].set(0.0).at[0, config.eos_token_id].set(0.5)
    embed = p["model"]["embed_tokens"]["embedding"].at[:, 0].set(1.0)
    p = {**p, "model": {**p["model"], "embed_tokens": {"embedding": embed}}, "lm_head": {"kernel": kernel}}
    save_model_checkpoint(root / "student", p, config)
    big = get_config("micro", vocab_size=VOCAB, hidden_size=96)
    teacher = init_params(big, jax.random.key(1))
    save_model_checkpoint(root / "teacher", teacher, big)
    shutil.copytree(root / "student" / "tokenizer", root / "teacher" / "tokenizer")
    return root, (config, p, big, teacher, tokenizer)


@pytest.fixture(scope="module")
def ckpts(made):
    return made[0]


@pytest.fixture(scope="module")
def loaded(made):
    """(student config, student params, teacher config, teacher params, tokenizer), as saved."""
    return made[1]


def live(ckpts, *sets, steps=2):
    config = apply_opd_overrides(stage_section("micro", "opd_live"), [f"init={ckpts / 'student'}",
                                                                       f"teacher={ckpts / 'teacher'}", *SETS, *sets])
    return dataclasses.replace(config, steps=steps)


def batch_source(loaded, config, pool=None):
    model_config, _, teacher_config, teacher, tokenizer = loaded
    pool = pool if pool is not None else live_pool(config, tokenizer)
    return OPDBatches(config, model_config, tokenizer, pool, teacher, Qwen3_5MoeForCausalLM(teacher_config))


def at_step(params, step):
    return types.SimpleNamespace(params=params, step=np.int32(step))


# ---------------------------------------------------------------------------------------------- action mask

def _canonical_turns(tokenizer, harness, episode):
    """{prompt text before assistant turn j: the turn's canonical text after the generation prompt}."""
    from hat_jax.harness.render import render_text

    msgs, table = list(episode.messages), {}
    for j, m in enumerate(msgs):
        if m["role"] == "assistant":
            before = render_text(tokenizer, harness, msgs[:j], add_generation_prompt=True)
            table[before] = render_text(tokenizer, harness, msgs[:j + 1])[len(before):].removesuffix("\n")
    return table


def _scripted(tokenizer, table):
    """A `generate` stand-in writing table[decoded prompt] (logprob -1 per token)."""
    def fake(params, config, ids, mask, rng, sampling, dtype=None, moe_impl=None, return_expert_ids=False):
        b, n = ids.shape[0], sampling.max_new_tokens
        tokens, lengths, finished = np.zeros((b, n), np.int32), np.zeros((b,), np.int32), np.zeros((b,), bool)
        for r in range(b):
            text = decode(tokenizer, np.asarray(ids[r])[np.asarray(mask[r]).astype(bool)])
            out = tokenizer(table[text], add_special_tokens=False)["input_ids"]
            finished[r], out = len(out) <= n, out[:n]
            tokens[r, :len(out)], lengths[r] = out, len(out)
        lp = np.where(np.arange(n)[None] < lengths[:, None], -1.0, 0.0).astype(np.float32)
        return types.SimpleNamespace(tokens=tokens, logprobs=lp, lengths=lengths, finished=finished)
    return fake


def _runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return list(zip(edges[::2], edges[1::2]))


def test_action_mask_is_the_sampled_turns_only(ckpts, loaded, world, harness, oracle):
    plain = [e for e in oracle if sum(m["role"] == "user" for m in e.messages) == 1
             and any(m["role"] == "tool" for m in e.messages)]
    plain = sorted(plain, key=lambda e: len(json.dumps(e.messages)))[:2]  # the shortest: 1,024-token rows
    assert len(plain) == 2
    config = live(ckpts, "loss=exact", "prompts_per_step=2", "samples_per_prompt=1", "max_new_tokens=400",
                  "max_turns=8", "seq_len=3072", "bucket=3072", "train_bucket=512",
                  "pack_rows=false")  # one episode per row: the rows are read against the rollout's
    source = batch_source(loaded, config, LiveTasks(tuple(e.task for e in plain), world, harness))
    table = {}
    for e in plain:
        table.update(_canonical_turns(source.tokenizer, harness, e))
    source.sampler = dataclasses.replace(source.sampler, generate_fn=_scripted(source.tokenizer, table))
    host = source(at_step(None, 0))
    rollout = host["rollout"]
    assert not rollout.truncated.any() and rollout.stats["outcomes"] == {"replied": 2}
    gaps = 0
    for i in range(2):
        runs = _runs(host["action_mask"][i])
        text = lambda a, z: decode(source.tokenizer, host["input_ids"][i, a:z])
        assert [text(a, z) for a, z in runs] == rollout.turn_texts[i]  # action = exactly the sampled turns
        assert len(runs) >= 2 and runs[-1][1] == rollout.stats["seq_lens"][i]
        between = [text(z, a) for (_, z), (a, _) in zip(runs, runs[1:])]
        gaps += sum("<tool_response>" in t for t in between)  # the environment's tokens: never actions
    assert gaps >= 2
    assert host["input_ids"].shape == (2, 3072 if rollout.input_ids.shape[1] > 2560 else
                                       -(-rollout.input_ids.shape[1] // 512) * 512)

    # both losses ignore the teacher wherever the target token is not sampled
    model_config, params = loaded[:2]
    model = Qwen3_5MoeForCausalLM(model_config)
    noise = np.random.default_rng(0).normal(0, 3.0, host["teacher_logprobs"].shape).astype(np.float32)
    env_pos = host["action_mask"] == 0
    next_env = np.concatenate([env_pos[:, 1:], np.ones_like(env_pos[:, :1])], axis=1)  # hidden t predicts token t+1
    perturbed = {**host, "teacher_logprobs": np.where(env_pos, noise, host["teacher_logprobs"]),
                 "teacher_hidden": np.where(next_env[..., None], host["teacher_hidden"] * 3.0, host["teacher_hidden"])}
    kernel = source.teacher_params["lm_head"]["kernel"]
    for loss in ("sampled", "exact"):
        loss_fn = jax.jit(opd_loss_fn(model, dataclasses.replace(config, loss=loss)))
        a, b = (loss_fn(params, {**{k: jnp.asarray(h[k]) for k in EXACT_KEYS}, "teacher_kernel": kernel}, None)
                for h in (host, perturbed))
        assert np.isfinite(float(a[0])) and float(a[1]) == host["action_mask"].sum()
        np.testing.assert_allclose(float(b[0]), float(a[0]), rtol=1e-6, err_msg=loss)


# ---------------------------------------------------------------------------------------------- determinism

def test_a_step_is_a_function_of_seed_and_step(ckpts, loaded, harness):
    config = live(ckpts, "harness_mode=hsa", "seq_len=2048", "bucket=2048")
    params = loaded[1]
    a = batch_source(loaded, config)(at_step(params, 0))
    b = batch_source(loaded, config)(at_step(params, 0))  # a fresh source: nothing carried between calls
    for key in ("input_ids", "attention_mask", "action_mask", "old_logprobs", "teacher_logprobs"):
        assert np.array_equal(a[key], b[key]), key
    assert a["stats"]["reward/total"] == b["stats"]["reward/total"]
    assert a["input_ids"].shape == (4, 2048) and a["action_mask"].sum() > 0
    # the RL stage's draws: same tasks and HSA variants at the same (seed, step)
    rl = RLConfig(seed=config.seed, harness_mode="hsa", tasks_per_step=config.prompts_per_step)
    pool = a["rollout"].episodes
    tasks = rl_tasks(config.world)
    assert [e.task for e in pool[::2]] == [tasks[i] for i in step_task_indices(len(tasks), rl, 1)]
    assert [h.version for h in a["harnesses"]] == [h.version for h in step_harnesses(harness, rl, 1, 2)]
    assert [e.harness_version for e in pool] == [h.version for h in a["harnesses"] for _ in range(2)]
    assert all(h.version != harness.version for h in a["harnesses"])
    later = (step_task_indices(len(tasks), rl, 2), [h.version for h in step_harnesses(harness, rl, 2, 2)])
    assert later[1] != [h.version for h in a["harnesses"]]  # the next step draws anew


def test_bad_live_settings_are_named(ckpts, loaded):
    short = apply_opd_overrides(stage_section("micro", "opd"), ["prompts=live"])  # the general section's seq_len 192
    with pytest.raises(ValueError, match=r"seq_len = 192: a live-stream prompt has \d+ tokens.*opd_live: --live"):
        live_pool(short, loaded[4])
    with pytest.raises(ValueError, match="enable_thinking = False is not supported with prompts = 'live'"):
        apply_opd_overrides(stage_section("micro", "opd_live"), ["enable_thinking=false"])
    with pytest.raises(ValueError, match="harness_mode = 'both'; valid: original, hsa"):
        apply_opd_overrides(stage_section("micro", "opd_live"), ["harness_mode=both"])
    with pytest.raises(ValueError, match="prompts = 'web'; valid: general, tulu, live"):
        apply_opd_overrides(stage_section("micro", "opd"), ["prompts=web"])


# ---------------------------------------------------------------------------------------------- end to end

DOCUMENTED = ("train/loss", "train/grad_norm", "train/lr", "kl/reverse_k1", "kl/reverse_k3", "policy/clip_frac",
              "policy/ratio_mean", "policy/entropy", "moe/expert_load_cv", "rollout/completion_len",
              "rollout/finished_frac", "rollout/gen_tokens_per_s", "rollout/turns", "rollout/truncated_frac",
              "rollout/reasoning_len", "rollout/tokens", "rollout/seq_len", "reward/accuracy", "reward/effectiveness",
              "reward/tool_rationality", "reward/skill_selection", "reward/cot_length", "reward/total",
              "rollout/outcome_replied", "time/generation_s", "time/teacher_s", "time/train_s", "time/env_s",
              "time/rollout_s", "rollout/calls_per_ep", "rollout/name_valid", "rollout/skill_acc", "rollout/chain_done",
              "rollout/fact_fetched", "rollout/relayed", "rollout/abstained")


def test_cli_run_with_a_larger_teacher_resumes_with_the_same_metrics(ckpts, tmp_path):
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    args = ["--preset", "micro", "--live", "--init", str(ckpts / "student"), "--teacher", str(ckpts / "teacher"),
            "--out", str(killed), "--steps", "2", "--no-progress", *(a for s in SETS for a in ("--set", s))]
    proc = subprocess.Popen([sys.executable, "-m", "hat_jax.train.opd", *args], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    watcher = sigkill_when_dir_appears(proc, killed / "1")
    config = live(ckpts)
    state = run_opd(config, reference, progress=False)  # the uninterrupted reference, meanwhile
    watcher.wait()
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err[-4000:]
    assert latest_step(killed) == 1
    assert main([*args, "--resume"]) == 0
    assert int(state.step) == 2 and latest_step(killed) == 2
    _, want = load_model_checkpoint(reference)
    _, got = load_model_checkpoint(killed)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves(got)):
        assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)

    rows, resumed = read_metrics(reference), read_metrics(killed)
    assert [r["step"] for r in rows] == [r["step"] for r in resumed] == [1, 2]
    for row, other in zip(rows, resumed):
        missing = [t for t in DOCUMENTED if t not in row or t not in other]
        assert not missing, missing
        assert all(check_tag(t) for t in row if t not in ("step", "time"))
        same = [t for t in row if t in other and not t.startswith("time/") and "per_s" not in t and t != "time"]
        assert {t: row[t] for t in same} == {t: other[t] for t in same}
        assert np.isfinite(row["train/loss"]) and np.isfinite(row["kl/reverse_k1"]) and row["rollout/tokens"] > 0
    assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy at the step's start
    assert rows[0]["train/loss"] == pytest.approx(rows[0]["kl/reverse_k1"], abs=1e-4)  # -rho A = k1 at rho = 1
