"""The micro scale: the test suite's end-to-end runs, seconds per stage and 2 items per evaluation suite.

    python experiments/run.py --exp table6_both --preset micro
    python -m hat_jax.train.sft --preset micro --out runs/sft          # one stage: its section of this file
    python -m hat_jax.train.rl --preset micro --init runs/sft --out runs/rl

The micro architecture (`hat_jax.model.get_config("micro")`) with tiny's 4,096-token vocabulary: at micro's
own 512 the production prompt is ~2,250 tokens, too long for RL's rows of 2,048, so SFT -> RL would not chain;
at 4,096 it is ~930 (HSA prompts up to ~2,000).
"""

import dataclasses

from hat_jax.data.pipeline import SFTDataConfig
from hat_jax.data.world_data import WorldDataConfig
from hat_jax.eval import EvalConfig
from hat_jax.experiments.scales import BaseSpec, Scale, TeacherSpec
from hat_jax.train.opd_config import OPDConfig
from hat_jax.train.optim import OptimConfig
from hat_jax.train.pretrain import PretrainConfig
from hat_jax.train.rl import RLConfig
from hat_jax.train.sft import SFTConfig

# The MTP loss weight of every stage: DeepSeek-V3's lambda (arXiv 2412.19437, section 4.2: 0.3, then 0.1),
# the default of Megatron's and slime's mtp_loss_scaling_factor (`hat_jax.train.mtp`).
MTP_COEF = 0.1

# The model and the tokenizer's key, shared by the base and SFT (one tokenizer; the base loads as SFT's init).
MODEL = dict(preset="micro", model_overrides=(("vocab_size", 4096),),
             world=WorldDataConfig(sft_tasks=48, rl_tasks=0, eval_items=0), tokenizer_texts=200)
RL_WORLD = WorldDataConfig(sft_tasks=0, rl_tasks=16, eval_items=0)


def get_config() -> Scale:
    # Short rows (most tool chats are truncated before the call): a plumbing check only.
    base = PretrainConfig(**MODEL, n_chats=32, seq_len=256, batch_size=2, steps=4,
                          optim=OptimConfig(lr=3e-3, warmup_steps=1), probe_items=4, log_every=1, ckpt_every=2,
                          mtp_coef=MTP_COEF)
    # seq_len 1280 gives ~95% of the rows loss tokens at p_hsa 0.5 (distractor tools lengthen the prompt).
    sft = SFTConfig(**MODEL, data=SFTDataConfig(seq_len=1280, batch_size=2, p_hsa=0.5, num_epochs=None, prefetch=2),
                    optim=OptimConfig(lr=3e-3, warmup_steps=2, weight_decay=0.0), steps=20, log_every=2,
                    ckpt_every=10, mtp_coef=MTP_COEF)
    # General prompts fit in seq_len - max_new_tokens; bucket = seq_len: one sampler compilation. The live-stream
    # fields (world, max_turns) are RL's, inert for general prompts.
    opd = OPDConfig(preset="micro", prompt_pool=64, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16,
                    seq_len=192, bucket=192, world=RL_WORLD, max_turns=2,
                    optim=OptimConfig(lr=1e-3, warmup_steps=0, weight_decay=0.0), steps=4, log_every=1, ckpt_every=2,
                    mtp_coef=MTP_COEF)
    # Live prompts and rows padded to seq_len: one sampler and one training shape (the HSA prompts' lengths vary,
    # and a compilation per 256-token bucket cost more than the padding).
    opd_live = dataclasses.replace(opd, preset="micro_live", prompts="live", seq_len=2048, bucket=2048)
    # One padded prompt width (bucket = seq_len) for the rollouts: one sampler compilation per batch size, which
    # is most of a micro stage's time.
    rl = RLConfig(world=RL_WORLD, tasks_per_step=2, group_size=2, steps=3, max_new_tokens=16, max_turns=2,
                  seq_len=2048, rollout_bucket=2048, train_bucket=2048, optim=OptimConfig(lr=1e-3, min_lr_ratio=1.0),
                  log_every=1, ckpt_every=1, mtp_coef=MTP_COEF)
    teacher = dataclasses.replace(sft, model_overrides=sft.model_overrides + (("hidden_size", 48),))
    evaluation = EvalConfig(world=WorldDataConfig(sft_tasks=48, rl_tasks=16, eval_items=2), max_new_tokens=16,
                            max_turns=2, seq_len=2048, batch_size=2, bucket=2048, ifeval_limit=3,
                            ifeval_mini_items=3, if_max_new_tokens=16, mtp_items=2)
    return Scale(name="micro", base=BaseSpec(pretrain=base), sft=sft, opd=opd, rl=rl, opd_live=opd_live,
                 teacher=TeacherSpec(sft=teacher), eval=evaluation)
