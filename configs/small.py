"""The small scale: tiny's model and world, with a base that reads its exercises and a longer HSA-SFT.

    python experiments/run.py --exp table4_hsa_sft --preset small     # the reading base, then HSA-SFT
    python experiments/run.py --exp table3 --preset small --seeds 0,1,2

The tiny model (5.1M parameters) and every tiny section, except:
- the base: 1,200 steps on a corpus of which 80% are short reading exercises (`hat_jax.data.reading`: label,
  lookup, copy and call; loss on their answers) and 20% the tool and general chats of tiny's base, at the
  reading gauge's learning rate (1e-3, 50 warmup steps). The reading transition comes between steps 800 and
  1,200 in this mix; tiny's 192 steps never reach it.
- HSA-SFT: 400 steps (about two passes over its records instead of a fifth of one).

What it shows today (seed 0, docs/tuning.md "A mixed base, then HSA-SFT"): the base copies 44% of label and 40%
of call answers exactly, but its recall probe on the world's tool chats stays at 0; after HSA-SFT every Live QA
call names a real tool (validity 100) and 34% of skill loads are right, while under renamed harnesses no call
does (Variant QA validity 0): the model writes names in HSA's style instead of reading them. No target of the
tiny-scale science is met at this budget. Cost on 2 cores: the base about 60 minutes (cached after the first
run), SFT about 30, the evaluation about 15.
"""

import dataclasses

from hat_jax.experiments.scales import with_world_harness
from hat_jax.train.stage import load_config

READING_KINDS = ("label", "copy", "call", "tools")


def get_config():
    tiny = with_world_harness(load_config("tiny"), "compact")
    base = dataclasses.replace(
        tiny.base.pretrain, steps=1200, n_chats=24576, reading_share=0.8, reading_kinds=READING_KINDS,
        optim=dataclasses.replace(tiny.base.pretrain.optim, lr=1e-3, warmup_steps=50), ckpt_every=200,
        max_to_keep=7)
    sft = dataclasses.replace(tiny.sft, steps=400, ckpt_every=100)
    return dataclasses.replace(tiny, name="small", base=dataclasses.replace(tiny.base, pretrain=base), sft=sft)
