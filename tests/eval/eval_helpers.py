"""Shared pieces of the eval tests: a micro-sized tokenizer that covers the eval prompts."""

from __future__ import annotations

import json
from pathlib import Path


from hat_jax.data.general import general_prompts
from hat_jax.data.suites import SUITES, item_harness
from hat_jax.data.world_data import WorldDataConfig, eval_items, world_for
from hat_jax.harness.render import render_text
from hat_jax.sim.world_harness import production_harness
from hat_jax.tokenizer import train_bpe_tokenizer

SHARED_IFEVAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "ifeval" / "input_data.jsonl"
TINY_WORLD = WorldDataConfig(sft_tasks=8, rl_tasks=0, eval_items=2)


def eval_tokenizer(out_dir: Path, vocab_size: int = 4096, world: WorldDataConfig = TINY_WORLD):
    """A byte-level BPE trained on the rendered first prompts of the eval items of `world` (every suite),
    general eval prompts and a few English sentences: the eval prompts tokenise short."""
    original = production_harness()
    bytes_only = train_bpe_tokenizer(["x"], 300, out_dir / "bytes")  # only to render the texts below
    texts = []
    for suite in SUITES:
        for item in eval_items(suite, world):
            h = item_harness(item, original)
            texts.append(render_text(bytes_only, h, [{"role": "user", "content": item.task.message}], True))
    texts += [p.prompt for p in general_prompts(20, 0, "eval")]
    texts += ["Write a short story about a river. Use no commas.", "</think>\n\nHello there, any other questions?"]
    return train_bpe_tokenizer(texts * 2, vocab_size, out_dir / "bpe")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


__all__ = ["SHARED_IFEVAL", "TINY_WORLD", "eval_tokenizer", "read_jsonl", "world_for"]
