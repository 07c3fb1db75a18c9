"""Read probe: does a checkpoint read its context, or only the templates? Teacher-forced span accuracy.

Why: at tiny scale the live-stream suites can stay flat while the SFT loss falls, because the loss is mostly
template tokens. The tokens that decide an episode are the few the model must *read* from its context: the
viewer's intent (the oracle's first reasoning words, "观众在问价格" ...), tool arguments copied from the
question or a tool result, the product id from a search result, and the price put into the reply. This probe
scores exactly those spans on oracle trajectories the model did not train on, in one teacher-forced forward
pass per batch: cheap, and free of sampling noise, so training variants can be compared in a minute.

Variant implemented:
- Rows: oracle trajectories (`hat_jax.data.world_data.oracle_records`) of held-out Live-Stream QA tasks
  (`eval_items("live_qa")`), tokenised by `hat_jax.data.pipeline.sft_dataset` (original harness, or HSA with
  probability `p_hsa`), so the loss mask is SFT's.
- A span is a regex group (`SPAN_PATTERNS`) matched in the text of a row's loss tokens; it counts as read
  when every loss token overlapping it is the argmax of the model's prediction (greedy decoding would
  reproduce it, in the tokenizer's own segmentation, given the gold prefix).
- Also reported: argmax accuracy and mean NLL (nats) over all loss tokens.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from hat_jax.sim.oracle_replies import INTENT_CN

SPAN_PATTERNS: dict[str, re.Pattern] = {
    "intent": re.compile("观众在问(" + "|".join(sorted(map(re.escape, set(INTENT_CN.values())), key=len,
                                                        reverse=True)) + ")"),
    "argument": re.compile(r"<parameter=[^>\n]+>\n([^\n<]+)\n</parameter>"),
    # the search query, one of the arguments: the product name copied from the viewer's message (under the
    # original argument name; an HSA-renamed one counts as an argument only)
    "query": re.compile(r"<parameter=query>\n([^\n<]+)\n</parameter>"),
    "product_id": re.compile(r"(P\d{4})"),
    "price": re.compile(r"(\d+(?:\.\d+)?)元"),
    # the names the reasoning reads from the harness: the skill to load, then each turn's first tool
    # (`hat_jax.sim.oracle_replies.tool_reasoning`: "...先加载技能price-promotion。", "查价格，用get_price。")
    "skill": re.compile(r"先加载(?:技能)?([A-Za-z][\w.\-]*)。"),
    "tool": re.compile(r"，用([A-Za-z][\w.\-]*)[、。]"),
}


def span_hits(pieces: Sequence[str], correct: Sequence[bool],
              patterns: Mapping[str, re.Pattern] = SPAN_PATTERNS) -> dict[str, list[int]]:
    """Read spans of one row.

    Args:
      pieces: the decoded text of each loss token, in order (their concatenation is the text searched).
      correct: per loss token, whether the prediction was right (same length as `pieces`).
      patterns: span name -> regex whose group 1 is the span.
    Returns:
      {name: [spans read, spans found]}: a span is read when every token overlapping it is correct.
    Raises:
      ValueError: `pieces` and `correct` differ in length.
    """
    if len(pieces) != len(correct):
        raise ValueError(f"span_hits: {len(pieces)} pieces but {len(correct)} correctness flags")
    text = "".join(pieces)
    lengths = np.asarray([len(p) for p in pieces], dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    ok = np.asarray(correct, dtype=bool)
    out = {}
    for name, pattern in patterns.items():
        hits = found = 0
        for match in pattern.finditer(text):
            a, z = match.span(1)
            overlap = (ends > a) & (starts < z)
            found += 1
            hits += int(ok[overlap].all())
        out[name] = [hits, found]
    return out


@dataclasses.dataclass
class ProbeResult:
    """spans: name -> [read, found]; token_accuracy in [0, 1]; nll: nats per loss token; tokens: loss tokens."""

    spans: dict[str, list[int]]
    token_accuracy: float
    nll: float
    tokens: int

    def rates(self) -> dict[str, float]:
        """name -> share of spans read (0 when none was found)."""
        return {k: (h / n if n else 0.0) for k, (h, n) in self.spans.items()}


def model_logits_fn(params: dict, model_config: Any):
    """(input_ids [B, T] int32, attention_mask [B, T] bool) -> logits [B, T, V] float32 of a checkpoint (jitted)."""
    import jax
    import jax.numpy as jnp

    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM

    model = Qwen3_5MoeForCausalLM(model_config)
    forward = jax.jit(lambda p, ids, mask: model.apply({"params": p}, ids, attention_mask=mask).logits)
    return lambda ids, mask: np.asarray(forward(params, jnp.asarray(ids), jnp.asarray(mask)), np.float32)


def read_probe(logits_fn, tokenizer: Any, batches: Iterable[Mapping[str, np.ndarray]],
               patterns: Mapping[str, re.Pattern] = SPAN_PATTERNS) -> ProbeResult:
    """Teacher-forced span accuracy on `batches` (module docstring).

    Args:
      logits_fn: (input_ids, attention_mask) -> logits [B, T, V], e.g. `model_logits_fn(params, config)`.
      tokenizer: decodes single tokens (`decode([id])`).
      batches: SFT-layout dicts: "input_ids" [B, T] int32, "attention_mask" [B, T], "loss_mask" [B, T]
        (1 on the tokens to score; token t is predicted from the logits at t - 1).
    Returns:
      ProbeResult.
    Raises:
      ValueError: the batches hold no loss token.
    """
    import jax.numpy as jnp

    from hat_jax.rollout.logprobs import token_logprobs

    spans = {k: [0, 0] for k in patterns}
    total = right = 0
    nll = 0.0
    for batch in batches:
        ids = np.asarray(batch["input_ids"])
        mask = np.asarray(batch["loss_mask"])[:, 1:].astype(bool)
        logits = np.asarray(logits_fn(ids, np.asarray(batch["attention_mask"]).astype(bool)), np.float32)
        target = ids[:, 1:]
        pred = logits[:, :-1].argmax(-1)
        nll -= float(np.asarray(token_logprobs(jnp.asarray(logits), jnp.asarray(ids)))[:, 1:][mask].sum())
        total += int(mask.sum())
        right += int(((pred == target) & mask).sum())
        for r in range(ids.shape[0]):
            pos = np.nonzero(mask[r])[0]
            row = span_hits([tokenizer.decode([int(t)]) for t in target[r, pos]], pred[r, pos] == target[r, pos],
                            patterns)
            for k, (h, n) in row.items():
                spans[k][0] += h
                spans[k][1] += n
    if total == 0:
        raise ValueError("read_probe: the batches hold no loss token")
    return ProbeResult(spans, right / total, nll / total, total)
