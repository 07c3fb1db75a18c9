"""The tiny scale, the CPU default: a 5.1M-parameter model of the target architecture, its base pretrained here.

    python experiments/run.py --exp table6_both                     # the main job (--preset tiny is the default)
    python experiments/run.py --exp table6 --resume                 # every row of Table 6, then the table
    python -m hat_jax.train.sft --preset tiny --out runs/sft         # one stage: its section of this file

Sized for a laptop: `table6_both` (base, HSA-SFT, HSA-RL, every suite) takes about 30 minutes on 2 idle cores
(measurements: docs/tuning.md); `--set eval.world.eval_items=200` gives the larger evaluation sets.
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
MODEL = dict(preset="tiny", model_overrides=(), world=WorldDataConfig(), tokenizer_texts=2000)
RL_WORLD = WorldDataConfig(sft_tasks=0, rl_tasks=400, eval_items=0)


def get_config() -> Scale:
    # Rows of 1,024 hold 99.9% of the pretraining chats whole; 192 steps of 4 rows is what the 20-minute budget
    # leaves for the base (longer pretraining is what the tiny chain is most short of: docs/tuning.md).
    base = PretrainConfig(**MODEL, n_chats=1024, seq_len=1024, batch_size=4, steps=192,
                          optim=OptimConfig(lr=3e-3, warmup_steps=6, weight_decay=0.01), probe_items=32,
                          log_every=8, ckpt_every=48, mtp_coef=MTP_COEF)
    # 4 packed rows of 2,048 tokens per step in one micro-batch (8 rows in one forward were OOM-killed on a shared
    # 24 GiB machine); checkpoints every quarter of the stage, so a killed stage loses at most that much.
    sft = SFTConfig(**MODEL, data=SFTDataConfig(seq_len=2048, batch_size=4, p_hsa=0.5, num_epochs=None, prefetch=4),
                    optim=OptimConfig(lr=2e-3, warmup_steps=8, weight_decay=0.01), steps=100, accum_steps=1,
                    log_every=10, ckpt_every=25, mtp_coef=MTP_COEF)
    # General prompts must fit in seq_len - max_new_tokens = 128 tokens, so bucket 128: one sampler compilation.
    opd = OPDConfig(preset="tiny", prompt_pool=1000, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=128,
                    seq_len=256, bucket=128, train_bucket=512, max_turns=6, world=RL_WORLD,
                    optim=OptimConfig(lr=2e-4, warmup_steps=5, weight_decay=0.0), steps=20, log_every=5,
                    ckpt_every=5, mtp_coef=MTP_COEF)
    # As RL below (tasks x episodes 4 x 4, 4 micro-batches) with 512-token prompt buckets (128 compiled the sampler
    # for ~4x more shapes); 4 steps, all of them warmup.
    opd_live = dataclasses.replace(opd, preset="tiny_live", prompts="live", prompts_per_step=4, seq_len=3072,
                                   bucket=512, accum_steps=4, steps=4, ckpt_every=1,
                                   optim=dataclasses.replace(opd.optim, warmup_steps=4))
    # lr 1e-4: at 6e-4 the 6 steps raise Live QA Accuracy 40 -> 94 by abstaining (94% of the episodes with a
    # fact to give state none; 0.3 calls per episode against 1.9), small's finding too (docs/tuning.md, "HSA-RL").
    # Wide padding buckets: each new (rows, width) shape costs a 15-20 s compilation on 2 cores.
    rl = RLConfig(world=RL_WORLD, tasks_per_step=4, group_size=4, steps=6, max_new_tokens=96, max_turns=5,
                  seq_len=3072, rollout_bucket=1024, train_bucket=1024, optim=OptimConfig(lr=1e-4, min_lr_ratio=1.0),
                  accum_steps=4, log_every=1, ckpt_every=1, mtp_coef=MTP_COEF)
    teacher = dataclasses.replace(sft, steps=160, ckpt_every=40,
                                  model_overrides=(("hidden_size", 192), ("moe_intermediate_size", 192)))
    # 50 items per suite (the paper-size 200 takes ~4x the evaluation time); decoding as the paper's serving
    # (temperature 1.0, top-p 0.95): greedy decoding of the tiny model repeats one tool call.
    evaluation = EvalConfig(world=WorldDataConfig(eval_items=50), max_new_tokens=96, max_turns=5, batch_size=16,
                            bucket=1024, if_max_new_tokens=128, temperature=1.0, top_p=0.95)
    return Scale(name="tiny", base=BaseSpec(pretrain=base), sft=sft, opd=opd, rl=rl, opd_live=opd_live,
                 teacher=TeacherSpec(sft=teacher), eval=evaluation)
