"""Experiment presets ("scales"): every stage config an experiment chain uses, at one model scale.

`--preset micro|tiny|qwen3_6_35b_a3b` of `experiments/run.py` picks a `Scale`: the base (pretrained from scratch
at micro/tiny scale by `hat_jax.train.pretrain`; imported from a local Hugging Face folder at real scale), the
SFT / general-OPD / RL / live-OPD stage configs, the strong teacher of Table 5's distillation arm, and the
evaluation config. `--set section.field=value` overrides any field (sections: `SECTIONS`); `steps` of a
stage also moves the end of its learning-rate schedule (the stage's `with_steps`).

Sizes:
- micro: the test suite's end-to-end runs (seconds per stage, 2 items per suite).
- tiny: the CPU default, sized so that `table6_both` (base, HSA-SFT, HSA-RL, every suite) fits in 20 minutes on
  a 2-core machine (measured on 2 idle cores: 16.8 minutes from an empty cache, of which base 4.2 (tokenizer and
  world data included), SFT 4.3, RL 4.2, evaluation 4.1 minutes, compilations included, and 2.3 more with the
  541 IFEval prompts; peak memory 7.9 GiB): 50 items per live-stream suite
  (`--set eval.world.eval_items=200` for the larger sets, about 4x the evaluation time), all 541 IFEval
  prompts when the data is given, decoding as the paper's serving (temperature 1.0, top-p 0.95, seeded).
- qwen3_6_35b_a3b: the paper's setting for an accelerator host (HAT report, arXiv 2608.15763, "Training"); the base
  must be given with `--set base.hf_path=/path/to/Qwen3.6-35B-A3B` and the teacher with `--set teacher.path=...`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.cli_types import positive_int
from hat_jax.train.stage import apply_overrides, did_you_mean

SCALES: tuple[str, ...] = ("micro", "tiny", "qwen3_6_35b_a3b")
SECTIONS: tuple[str, ...] = ("base", "sft", "opd", "rl", "opd_live", "teacher", "eval")
STAGE_SECTIONS: tuple[str, ...] = ("sft", "opd", "rl", "opd_live")


@dataclasses.dataclass(frozen=True)
class BaseSpec:
    """Where the base comes from: `pretrain` (a `PretrainConfig`, trained and cached) or `hf_path` (imported)."""

    pretrain: Any = None
    hf_path: str | None = None


@dataclasses.dataclass(frozen=True)
class TeacherSpec:
    """Table 5's strong teacher: an existing checkpoint (`path`) or one trained by HSA-SFT (`sft`, cached)."""

    sft: Any = None
    path: str | None = None


@dataclasses.dataclass(frozen=True)
class Scale:
    """All configs of one preset (module docstring). Stage configs carry no init/teacher/seed yet: the chain
    runner (`hat_jax.experiments.chain`) sets those."""

    name: str
    base: BaseSpec
    sft: Any
    opd: Any
    rl: Any
    opd_live: Any
    teacher: TeacherSpec
    eval: Any

    def to_json(self) -> dict:
        from hat_jax.train.stage import config_json

        return config_json(self)


def _micro() -> Scale:
    from hat_jax.eval import EvalConfig
    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.train.opd import opd_preset
    from hat_jax.train.pretrain import PRETRAIN_PRESETS
    from hat_jax.train.rl import rl_preset
    from hat_jax.train.sft import sft_preset

    sft = sft_preset("micro")
    opd = opd_preset("micro")
    # One padded prompt width (bucket = seq_len) for the rollouts and the eval: one sampler compilation per
    # batch size, which is most of a micro stage's time.
    rl = dataclasses.replace(rl_preset("micro"), rollout_bucket=2048)
    return Scale(
        name="micro", base=BaseSpec(pretrain=PRETRAIN_PRESETS["micro"]), sft=sft, opd=opd, rl=rl,
        opd_live=opd_preset("micro_live"),
        teacher=TeacherSpec(sft=dataclasses.replace(sft, model_overrides=sft.model_overrides + (("hidden_size", 48),))),
        eval=EvalConfig(world=WorldDataConfig(sft_tasks=48, rl_tasks=16, eval_items=2), max_new_tokens=16,
                        max_turns=2, seq_len=2048, batch_size=2, bucket=2048, ifeval_limit=3,
                        ifeval_mini_items=3, if_max_new_tokens=16))


def _tiny() -> Scale:
    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.eval import EvalConfig
    from hat_jax.train.opd import opd_preset
    from hat_jax.train.pretrain import PRETRAIN_PRESETS
    from hat_jax.train.rl import rl_preset, with_steps as rl_steps
    from hat_jax.train.sft import sft_preset, with_steps as sft_steps

    # The 20-minute budget of table6_both on 2 cores (module docstring): SFT 4 rows x 2,048 tokens per step.
    sft = sft_steps(sft_preset("tiny"), 100)
    # Checkpoints every quarter of a stage, so a killed stage loses at most that much (resume restarts there).
    sft = dataclasses.replace(sft, accum_steps=1, data=dataclasses.replace(sft.data, batch_size=4),
                              optim=dataclasses.replace(sft.optim, lr=2e-3, warmup_steps=8), ckpt_every=25)
    opd = dataclasses.replace(opd_steps(opd_preset("tiny"), 20), ckpt_every=5)
    # Wide padding buckets: each new (rows, width) shape costs a 15-20 s compilation on 2 cores.
    # lr 6e-4, not the RL preset's 2e-5: 4 steps at 2e-5 barely move the policy (earlier init: Live QA Accuracy
    # 18, AVG 9.5). From the HSA-SFT checkpoints of seeds 0 / 1 / 2, table6_both's Live QA AVG after 6 steps:
    # lr 3e-4 37.0 / 29.0 / 36.0, lr 6e-4 46.5 / 42.5 / 43.5; seed 0 only: lr 3e-4 x 12 steps 37.0, lr 1e-3
    # 43.0. The gain is Accuracy (no wrong fact; 92 at lr 6e-4, seed 0) with Effectiveness near 0: most replies
    # are short and fact-free, without a tool call.
    rl = rl_steps(rl_preset("tiny"), 6)
    rl = dataclasses.replace(rl, max_new_tokens=96, max_turns=5, rollout_bucket=1024, train_bucket=1024, ckpt_every=1,
                             optim=dataclasses.replace(rl.optim, lr=6e-4))
    return Scale(
        name="tiny", base=BaseSpec(pretrain=PRETRAIN_PRESETS["tiny"]), sft=sft, opd=opd, rl=rl,
        opd_live=dataclasses.replace(opd_steps(opd_preset("tiny_live"), 4), ckpt_every=1),
        teacher=TeacherSpec(sft=dataclasses.replace(
            sft_steps(sft, 160), model_overrides=(("hidden_size", 192), ("moe_intermediate_size", 192)), ckpt_every=40)),
        # 50 items per suite (the paper-size default, 200, takes ~4x the eval time); decoding as the paper's
        # serving (temperature 1.0, top-p 0.95): greedy decoding of the tiny model repeats one tool call.
        eval=EvalConfig(world=WorldDataConfig(eval_items=50), max_new_tokens=96, max_turns=5, batch_size=16,
                        bucket=1024, if_max_new_tokens=128, temperature=1.0, top_p=0.95))


def _real() -> Scale:
    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.eval import EvalConfig
    from hat_jax.train.opd import OPDConfig
    from hat_jax.train.optim import OptimConfig
    from hat_jax.train.rl import RLConfig
    from hat_jax.train.sft import SFTConfig
    from hat_jax.data.pipeline import SFTDataConfig

    preset = "qwen3_6_35b_a3b"
    # The trained model at scale: a scan over the 4-layer blocks (compile time flat in depth), each layer
    # rematerialised (only its input is kept for the backward pass), the vocabulary (248,320) in 8,192-wide
    # chunks, so no [B, T, V] array exists, and the experts through megablox's grouped matmul (TPU; on a GPU host
    # set moe_impl=ragged_dot); attention_impl "auto" is splash on TPU (figures: docs/real_scale.md).
    fits = dict(scan_layers=True, remat_policy="full", vocab_chunk=8192, moe_impl="megablox")
    sft = SFTConfig(**fits, preset=preset, data=SFTDataConfig(seq_len=16384, batch_size=64, p_hsa=0.5, num_epochs=None),
                    optim=OptimConfig(lr=1e-5, warmup_steps=50, total_steps=2000, weight_decay=0.01), steps=2000,
                    compute_dtype="bfloat16", log_every=10, ckpt_every=200)
    # The paper distils on Tulu-3 prompts: --set opd.tulu_path=/data/tulu-3.parquet --set opd.prompts=tulu.
    opd = OPDConfig(**fits, preset=preset, prompts="general", prompt_pool=20000, prompts_per_step=64, samples_per_prompt=4,
                    max_new_tokens=2048, seq_len=4096, bucket=512, loss="sampled", compute_dtype="bfloat16",
                    optim=OptimConfig(lr=1e-6, warmup_steps=10, total_steps=300, min_lr_ratio=1.0), steps=300,
                    log_every=5, ckpt_every=50)
    rl = RLConfig(**fits, world=WorldDataConfig(sft_tasks=0, eval_items=0, rl_tasks=20000), tasks_per_step=64, group_size=8,
                  steps=300, max_new_tokens=2048, max_turns=8, seq_len=32768, rollout_bucket=1024,
                  train_bucket=4096, estimator="gdpo", routing_replay=True, compute_dtype="bfloat16",
                  optim=OptimConfig(lr=1e-6, warmup_steps=0, total_steps=300, min_lr_ratio=1.0), ckpt_every=20)
    return Scale(
        name=preset, base=BaseSpec(), sft=sft, opd=opd, rl=rl,
        opd_live=dataclasses.replace(opd, prompts="live", max_new_tokens=2048, seq_len=32768, bucket=1024),
        teacher=TeacherSpec(),
        eval=EvalConfig(world=WorldDataConfig(eval_items=978), max_new_tokens=2048, max_turns=8, seq_len=32768,
                        batch_size=64, bucket=1024, if_max_new_tokens=2048, compute_dtype="bfloat16"))


_BUILDERS = {"micro": _micro, "tiny": _tiny, "qwen3_6_35b_a3b": _real}


def get_scale(name: str) -> Scale:
    """The named preset. Raises ValueError listing the valid ones (with close matches)."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown preset {name!r}{did_you_mean(name, SCALES)}; valid presets: {', '.join(SCALES)}")
    return _BUILDERS[name]()


def opd_steps(config, steps: int):
    """An OPD config with `steps` and its schedule's end at `steps` (warmup capped)."""
    optim = dataclasses.replace(config.optim, total_steps=steps, warmup_steps=min(config.optim.warmup_steps, steps))
    return dataclasses.replace(config, steps=steps, optim=optim)


def _with_steps(section: str, config, steps: int):
    from hat_jax.train import rl, sft

    fn = {"sft": sft.with_steps, "rl": rl.with_steps, "opd": opd_steps, "opd_live": opd_steps}[section]
    return fn(config, steps)


def apply_scale_overrides(scale: Scale, assignments: Sequence[str]) -> Scale:
    """`section.field[.sub]=value` assignments (JSON values, else strings) applied to `scale`.

    `sft.steps=N` (also rl/opd/opd_live) uses the stage's `with_steps` (schedule end = N); `base.hf_path=P`
    and `teacher.path=P` set where the real-scale base and teacher come from; `base.<field>` otherwise
    overrides the pretraining config, `teacher.<field>` the teacher's SFT config.

    Raises:
      ValueError: a malformed assignment, an unknown section (lists `SECTIONS`) or field (lists the valid ones),
        a section without a field, a field the chain sets (`hat_jax.experiments.chain.CHAIN_FIELDS`), a value of the wrong type, a
        stage's steps below 1.
    """
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected section.field=value")
        key, value = item.split("=", 1)
        section, _, rest = key.strip().partition(".")
        if section in SECTIONS and not rest:
            raise ValueError(f"--set {item!r}: {section!r} is a section; name a field of it, as "
                             f"{section}.field=value (e.g. {section}.steps=6)")
        if section in STAGE_SECTIONS:
            from hat_jax.experiments.chain import CHAIN_FIELDS

            if rest in CHAIN_FIELDS:
                raise ValueError(f"--set {item!r}: {section}.{rest} is set by the experiment chain: "
                                 f"{CHAIN_FIELDS[rest]}")
        if section not in SECTIONS:
            raise ValueError(f"--set {item!r}: unknown section {section!r}{did_you_mean(section, SECTIONS)}; "
                             f"valid sections: {', '.join(SECTIONS)}, as section.field=value")
        if section == "base" and rest == "hf_path":
            scale = dataclasses.replace(scale, base=BaseSpec(pretrain=None, hf_path=value))
            continue
        if section == "teacher" and rest == "path":
            scale = dataclasses.replace(scale, teacher=TeacherSpec(sft=None, path=value))
            continue
        target = {"base": scale.base.pretrain, "teacher": scale.teacher.sft}.get(section, getattr(scale, section))
        if target is None:
            raise ValueError(f"--set {item!r}: preset {scale.name!r} has no {section} config to override "
                             f"(its {section} is {'imported' if section == 'base' else 'a given checkpoint'})")
        try:
            if rest == "steps" and section in STAGE_SECTIONS:
                try:
                    steps = positive_int(value)
                except argparse.ArgumentTypeError as err:
                    raise ValueError(f"{section}.steps: {err}") from None
                updated = _with_steps(section, target, steps)
            else:
                updated = apply_overrides(target, [f"{rest}={value}"])
        except ValueError as err:
            raise ValueError(f"--set {item!r}: {err}".replace(f"--set {rest}:", f"{section}.{rest}:")) from None
        if section == "base":
            scale = dataclasses.replace(scale, base=BaseSpec(pretrain=updated))
        elif section == "teacher":
            scale = dataclasses.replace(scale, teacher=TeacherSpec(sft=updated))
        else:
            scale = dataclasses.replace(scale, **{section: updated})
    return scale


def describe(scale: Scale, kinds: Sequence[str] | None = None) -> Mapping[str, Any]:
    """A short summary of the budget for logs and results.json: the base, the steps of each stage kind in
    `kinds` (every kind when None: "sft", "opd", "rl", "opd_live") and the eval items per suite."""
    base = scale.base.pretrain
    out: dict[str, Any] = {"base": ("hf:" + str(scale.base.hf_path)) if base is None else f"pretrain {base.steps} steps"}
    for kind in ("sft", "opd", "rl", "opd_live"):
        if kinds is None or kind in kinds:
            out[f"{kind}_steps"] = getattr(scale, kind).steps
    out["eval_items"] = scale.eval.world.eval_items
    return out
