"""The real scale: Qwen3.6-35B-A3B, the paper's setting (HAT report, arXiv 2608.15763, "Training") on accelerators.

    python experiments/run.py --exp table3_hat --preset qwen3_6_35b_a3b --set base.hf_path=/ckpt/Qwen3.6-35B-A3B \
        --set opd.tulu_path=/data/tulu-3-sft-mixture.parquet --set opd.prompts=tulu
    python -m hat_jax.aot --preset qwen3_6_35b_a3b --topology v5p-64 --stage sft     # compile a stage for a slice

The base is imported from a local Hugging Face folder (`--set base.hf_path=...`); Table 5's teacher is a given
checkpoint (`--set teacher.path=...`).
"""

import dataclasses

from hat_jax.data.pipeline import SFTDataConfig
from hat_jax.data.world_data import WorldDataConfig
from hat_jax.eval import EvalConfig
from hat_jax.experiments.scales import BaseSpec, Scale, TeacherSpec
from hat_jax.train.opd_config import OPDConfig
from hat_jax.train.optim import OptimConfig
from hat_jax.train.rl import RLConfig
from hat_jax.train.sft import SFTConfig

# The MTP loss weight of every stage: DeepSeek-V3's lambda (arXiv 2412.19437, section 4.2: 0.3, then 0.1),
# the default of Megatron's and slime's mtp_loss_scaling_factor (`hat_jax.train.mtp`).
MTP_COEF = 0.1

PRESET = "qwen3_6_35b_a3b"


def get_config() -> Scale:
    # The trained model at scale: a scan over the 4-layer blocks (compile time flat in depth), each layer
    # rematerialised (only its input is kept for the backward pass), the vocabulary (248,320) in 8,192-wide
    # chunks, so no [B, T, V] array exists, and the experts by expert parallelism: tokens sent by ragged
    # all-to-all to the devices holding their experts, megablox's grouped matmul there (TPU; on a GPU host set
    # moe_impl=ep_ragged_dot), each device's 16,384 tokens in chunks of 1,024 (moe_token_chunk: the MoE's
    # assignment and receive buffers a sixteenth the size; with the MTP layer 1,024 rather than 2,048 is what
    # brings the SFT step under 28 GiB per chip on v6e-64 with fp32 params and moments: 27.13 against 28.68);
    # attention_impl "auto" is splash on TPU (figures: docs/real_scale.md).
    fits = dict(scan_layers=True, remat_policy="full", vocab_chunk=8192, moe_impl="ep_megablox", moe_token_chunk=1024)
    sft = SFTConfig(**fits, preset=PRESET,
                    data=SFTDataConfig(seq_len=16384, batch_size=64, p_hsa=0.5, num_epochs=None),
                    optim=OptimConfig(lr=1e-5, warmup_steps=50, weight_decay=0.01), steps=2000,
                    compute_dtype="bfloat16", log_every=10, ckpt_every=200, mtp_coef=MTP_COEF)
    # The paper distils on Tulu-3 prompts: --set opd.tulu_path=/data/tulu-3.parquet --set opd.prompts=tulu.
    # OPD: moe_token_chunk 512 (buffers half SFT's): the update with the frozen teacher resident then fits
    # v6e-64's 28 GiB target with the MTP loss (27.60 GiB per chip; 28.68 at 1,024).
    opd = OPDConfig(**{**fits, "moe_token_chunk": 512}, preset=PRESET, prompts="general", prompt_pool=20000, prompts_per_step=64,
                    samples_per_prompt=4, max_new_tokens=2048, seq_len=4096, bucket=512, loss="sampled",
                    compute_dtype="bfloat16", optim=OptimConfig(lr=1e-6, warmup_steps=10, min_lr_ratio=1.0),
                    steps=300, log_every=5, ckpt_every=50, mtp_coef=MTP_COEF)
    # RL: 512 rows of up to 32,768 tokens; accum_steps 16 = one row per chip per micro-batch on v5p-64 (32 chips;
    # 63.32 GiB per chip with the MTP loss); rollouts in waves of 64 rows (2 per chip on v5p-64: 28.11 GiB per
    # chip with the policy's state resident, docs/real_scale.md). On v6e-64 (32 GiB chips) a row is split over 4
    # chips by context parallelism, unpacked: --set rl.mesh=[1,4,4,1,4] --set rl.accum_steps=32 --set
    # rl.pack_rows=false (27.60 GiB per chip; packed rows 28.41).
    rl = RLConfig(**fits, world=WorldDataConfig(sft_tasks=0, eval_items=0, rl_tasks=20000), tasks_per_step=64,
                  accum_steps=16, rollout_wave_rows=64,
                  group_size=8, steps=300, max_new_tokens=2048, max_turns=8, seq_len=32768, rollout_bucket=1024,
                  train_bucket=4096, estimator="gdpo", routing_replay=True, compute_dtype="bfloat16",
                  optim=OptimConfig(lr=1e-6, warmup_steps=0, min_lr_ratio=1.0), ckpt_every=20, mtp_coef=MTP_COEF)
    opd_live = dataclasses.replace(opd, prompts="live", max_new_tokens=2048, seq_len=32768, bucket=1024)
    evaluation = EvalConfig(world=WorldDataConfig(eval_items=978), max_new_tokens=2048, max_turns=8, seq_len=32768,
                            batch_size=64, bucket=1024, if_max_new_tokens=2048, compute_dtype="bfloat16",
                            mtp_vocab_chunk=8192)  # the MTP acceptance's argmaxes without [1, 32768, 248320] logits
    return Scale(name=PRESET, base=BaseSpec(), sft=sft, opd=opd, rl=rl, opd_live=opd_live, teacher=TeacherSpec(),
                 eval=evaluation)
