"""The four live-stream suites: multi-turn episodes of the policy (greedy by default), judged by the rule judges.

The HAT report, arXiv 2608.15763 (TaoLive, 2026), "Evaluation sets and metrics": Live-Stream QA and
Harness-Variant QA report Accuracy, Effectiveness and AVG; Tool robustness ADR, RC, TC and AVG; Prompt
robustness ADR, LLM, TCO and AVG (`hat_jax.judges.rules.SUITE_METRICS`, from the metric table).

Variant implemented and why:
- Items: `hat_jax.data.world_data.eval_items` (held-out seeds). Each item runs under its own harness
  (`item_harness` of the production harness) and its own faults (`item_env_config`), one episode per item
  (group size 1) through `hat_jax.rollout.rollout_episodes`, greedy by default (temperature 0) or sampled with
  the key fold_in(key(seed), chunk index), in chunks of `batch_size` items (one `rollout_episodes` call per
  chunk, its turns batched). An episode cut by the token or turn limits is judged as a cut episode (outcome
  "truncated": Accuracy 0, no reply).
- Judging: `hat_jax.judges.rules.judge_episode(episode, item harness)`. Short keys: `JudgeMetric.short`
  (accuracy -> acc, effectiveness -> eff; adr, rc, tc, llm, tco keep their names).
- Scores on 0-100: a metric is its mean over the suite's samples x 100. AVG: per sample, the mean of the
  suite's parts (e.g. (Accuracy + Effectiveness) / 2, with Effectiveness in {0, 0.5, 1}), then the mean
  over samples x 100. No part is ever "not applicable": the rule judges define every metric on every
  episode (TC and TCO are 1 for a task without gold calls, LLM is 1 when the prompt has no reply
  constraint, a reply-based metric is 0 when there is no reply), so every sample averages all its parts
  and every sample counts in every mean.
- Reading metrics (not the report's; never in AVG): `hat_jax.judges.reading` under the item harness, name_valid,
  skill_acc, chain_done, fact_fetched, relayed, abstained (0-100, None when their denominator is empty: no calls, no
  task needing a skill, no task with gold calls or a checkable gold fact, nothing fetched) and calls_per_ep (a
  count), after the suite's metrics in its scores.
- Reasoning length: `hat_jax.rollout.turns.reasoning_tokens` of each sampled turn (the count the RL stage's
  CoT penalty uses).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hat_jax.data.suites import EvalItem, item_env_config, item_harness, item_to_dict
from hat_jax.harness.state import HarnessState
from hat_jax.judges.reading import episode_reading, reading_scores
from hat_jax.judges.rules import SHORT_KEYS, SUITE_KEYS, SUITE_METRICS, Judgement, judge_episode
from hat_jax.rollout import RolloutConfig, Sampler, reasoning_tokens, rollout_episodes
from hat_jax.sim.catalog import World
from hat_jax.sim.types import episode_to_dict



def suite_keys(suite: str) -> tuple[str, ...]:
    """The short metric keys of `suite` plus "avg", e.g. ("acc", "eff", "avg") (the reading keys follow them in
    `run_live_suite`'s scores: `hat_jax.judges.reading.READING_KEYS`).

    Raises:
      ValueError: an unknown suite (names the valid ones).
    """
    if suite not in SUITE_KEYS:
        raise ValueError(f"suite: unknown {suite!r}; expected one of {tuple(SUITE_KEYS)}")
    return SUITE_KEYS[suite]


def sample_scores(suite: str, judgement: Judgement) -> dict[str, float]:
    """One sample's parts on [0, 1] under their short keys, plus "avg" = their mean (module docstring)."""
    parts = {SHORT_KEYS[m]: float(getattr(judgement, m)) for m in SUITE_METRICS[suite]}
    return {**parts, "avg": sum(parts.values()) / len(parts)}


def suite_scores(suite: str, judgements: Sequence[Judgement]) -> dict[str, float]:
    """The suite's metrics and AVG on 0-100: per-sample values averaged over samples, x 100.

    Raises:
      ValueError: no judgements, or an unknown suite.
    """
    keys = suite_keys(suite)
    if not judgements:
        raise ValueError(f"{suite}: no samples to score")
    rows = [sample_scores(suite, j) for j in judgements]
    return {k: 100.0 * float(np.mean([r[k] for r in rows])) for k in keys}


@dataclasses.dataclass
class SuiteResult:
    """scores: `suite_scores`, then the reading metrics (`hat_jax.judges.reading.READING_KEYS`, each a value or
    None); extra: timing and length statistics; records: one JSON-ready dict per item."""

    scores: dict[str, float | None]
    extra: dict[str, float]
    records: list[dict[str, Any]]


def run_live_suite(sampler: Sampler, suite: str, items: Sequence[EvalItem], config: RolloutConfig, *, world: World,
                   original: HarnessState, batch_size: int, seed: int = 0, progress: bool = False) -> SuiteResult:
    """Runs and judges every item of one suite (module docstring).

    Args:
      sampler: the policy. suite: one of `SUITE_METRICS`. items: its items.
      config: the episodes' decoding (temperature 0 = greedy), max_turns and seq_len; group_size must be 1 and
        env None (each item brings its faults).
      world: the catalog. original: the production harness the items' harnesses derive from.
      batch_size: episodes per `rollout_episodes` call. seed: chunk c samples with fold_in(key(seed), c).
      progress: a tqdm bar.
    Returns:
      SuiteResult: scores, the suite's keys then the reading keys; records {"item", "scores", "judgement", "reading"
      (`hat_jax.judges.reading.EpisodeReading` as a dict), "truncated", "turn_texts", "episode"}; extra =
      {"episodes", "turns" (mean model turns per episode), "reasoning_tokens" (mean per model turn),
      "truncated_pct", "tokens_generated", "generation_s", "wall_s", "episodes_per_s"}.
    Raises:
      ValueError: an unknown suite, no items, batch_size < 1, group_size != 1 or an env in `config`, an item of
        another suite, or a prompt that does not fit seq_len (from `rollout_episodes`, naming the task).
    """
    suite_keys(suite)  # validates the name
    if not items:
        raise ValueError(f"{suite}: no items to evaluate")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
    if config.group_size != 1 or config.env is not None:
        raise ValueError(f"{suite}: RolloutConfig.group_size must be 1 and env None (items carry their faults), got "
                         f"group_size={config.group_size}, env={config.env!r}")
    wrong = [it.item_id for it in items if it.suite != suite]
    if wrong:
        raise ValueError(f"{suite}: items of another suite given: {wrong[:3]}")
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    judgements, readings, records, turns, reasoning, truncated = [], [], [], [], [], []
    generated, gen_s = 0, 0.0
    chunks = [items[s:s + batch_size] for s in range(0, len(items), batch_size)]
    bar = tqdm(total=len(items), desc=suite, unit="ep", disable=not progress, leave=False)
    for c, chunk in enumerate(chunks):
        harnesses = [item_harness(it, original) for it in chunk]
        batch = rollout_episodes(sampler, world, [it.task for it in chunk], harnesses,
                                 jax.random.fold_in(jax.random.key(seed), c), config,
                                 env_configs=[item_env_config(it) for it in chunk])
        generated += batch.stats["tokens_generated"]
        gen_s += batch.stats["generation_s"]
        for it, harness, episode, texts, cut in zip(chunk, harnesses, batch.episodes, batch.turn_texts,
                                                    batch.truncated):
            judgement = judge_episode(episode, harness)
            judgements.append(judgement)
            readings.append(episode_reading(episode, harness))
            turns.append(len(texts))
            reasoning += [reasoning_tokens(sampler.tokenizer, t) for t in texts]
            truncated.append(bool(cut))
            records.append({"item": item_to_dict(it), "scores": {k: 100.0 * v for k, v in
                                                                 sample_scores(suite, judgement).items()},
                            "judgement": _judgement_json(judgement),
                            "reading": dataclasses.asdict(readings[-1]), "truncated": bool(cut), "turn_texts": texts,
                            "episode": episode_to_dict(episode)})
        bar.update(len(chunk))
    bar.close()
    wall = time.perf_counter() - t0
    scores = {**suite_scores(suite, judgements), **reading_scores(readings)}
    extra = {"episodes": float(len(items)), "turns": float(np.mean(turns)),
             "reasoning_tokens": float(np.mean(reasoning)) if reasoning else 0.0,
             "truncated_pct": 100.0 * float(np.mean(truncated)), "tokens_generated": float(generated),
             "generation_s": gen_s, "wall_s": wall, "episodes_per_s": len(items) / wall if wall > 0 else 0.0}
    return SuiteResult(scores, extra, records)


def _judgement_json(j: Judgement) -> dict[str, Any]:
    out: Mapping[str, Any] = dataclasses.asdict(j)
    return {**out, "severity": list(j.severity), "reasons": [list(r) for r in j.reasons]}
