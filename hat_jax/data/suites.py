"""Evaluation items of the four live-stream suites, built from the simulator with held-out seeds.

The HAT report, arXiv 2608.15763 (TaoLive, 2026), "Evaluation sets and metrics": Live-Stream QA (original harness; Accuracy, Effectiveness,
AVG), Harness-Variant QA (changed harness; same metrics), Tool robustness (ADR, RC, TC) and Prompt
robustness (ADR, LLM, TCO). The paper's sets are private; these are their simulator counterparts:

- live_qa: viewer tasks over every intent, the original harness, no faults.
- variant_qa: the same kind of tasks under a harness drawn from the *held-out* HSA families
  (`hat_jax.harness.hsa.compose(split="heldout")`): naming styles, word combinations and prompt
  layouts never sampled in training.
- tool_robustness: tasks that need world tools, each with one perturbation: "tool_failure" (faults
  injected at `TOOL_FAILURE_RATES`), "schema_variant" (tools renamed and schemas restructured) or
  "distractor_tools" (2-4 irrelevant tools added).
- prompt_robustness: tasks that need world tools, under the original harness plus a section of
  extra instruction constraints (1-2 drawn from `INSTRUCTION_POOL`) and one tool-order constraint
  (`first` -> `then`, both product-id tools, `then` in the task's plan); the task's gold plan gets the
  `first` call inserted before `then`, so TC and Tool Rationality expect it too.

Held-out seeds: suite tasks are drawn from their own seed streams (`SUITE_SEEDS`), and any task whose
viewer message also occurs among the training tasks (`training_messages`) is skipped, so no eval
message is a training message. An item stores only seeds; `item_harness` and `item_env_config`
rebuild its harness and faults deterministically.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping
from typing import Any

from hat_jax.harness.hsa import HSAConfig, compose
from hat_jax.harness.state import Constraint, HarnessState, PromptSection
from hat_jax.judges.rules import SUITE_METRICS
from hat_jax.sim.catalog import World
from hat_jax.sim.env import EnvConfig
from hat_jax.sim.types import INTENTS, Task, task_from_dict, task_to_dict
from hat_jax.sim.viewers import sample_task

SUITES: tuple[str, ...] = ("live_qa", "variant_qa", "tool_robustness", "prompt_robustness")
# Each suite's judge metrics and result keys come from the judges' metric table (`JudgeMetric.suites`).
if tuple(SUITE_METRICS) != SUITES:
    raise ValueError(f"judge metric table: `JudgeMetric.suites` name the suites {tuple(SUITE_METRICS)}; "
                     f"expected each of {SUITES}, in this order")
PAPER_SIZES: dict[str, int] = {"live_qa": 978, "variant_qa": 978, "tool_robustness": 1012, "prompt_robustness": 1011}
SUITE_SEEDS: dict[str, int] = {"live_qa": 9001, "variant_qa": 9002, "tool_robustness": 9003, "prompt_robustness": 9004}
TOOL_INTENTS: tuple[str, ...] = tuple(
    i for i in INTENTS if i not in ("identity", "chit_chat", "off_topic", "prompt_injection")
)
TOOL_PERTURBATIONS: tuple[str, ...] = ("tool_failure", "schema_variant", "distractor_tools")
TOOL_FAILURE_RATES: Mapping[str, float] = {"error": 0.25, "timeout": 0.15, "empty": 0.1}
# Extra instruction constraints of the prompt-robustness suite (registry ids with their kwargs).
INSTRUCTION_POOL: tuple[Constraint, ...] = (
    Constraint("start_with", {"phrase": "宝宝们好"}),
    Constraint("start_with", {"phrase": "来啦"}),
    Constraint("end_with", {"phrase": "感谢支持"}),
    Constraint("end_with", {"phrase": "喜欢就点关注哦"}),
    Constraint("must_include", {"phrase": "直播间"}),
    Constraint("must_include", {"phrase": "放心"}),
    Constraint("forbidden_phrase", {"phrase": "亲"}),
    Constraint("no_exclamation", {}),
    Constraint("no_emoji", {}),
    Constraint("max_chars", {"n": 90}),
)
# (first, then) tool-order constraints: both tools take a product id.
TOOL_ORDER_POOL: tuple[tuple[str, str], ...] = (
    ("get_product_detail", "get_price"),
    ("get_promotions", "get_price"),
    ("get_price", "get_promotions"),
    ("get_product_detail", "get_after_sales_policy"),
    ("get_product_detail", "estimate_shipping"),
    ("get_product_detail", "get_size_chart"),
    ("get_promotions", "estimate_shipping"),
)
EXTRA_SECTION_TITLE = "本场要求"


@dataclasses.dataclass(frozen=True)
class EvalItem:
    """One evaluation item: a task plus how its harness and environment differ from the original.

    Attributes:
      suite: one of `SUITES`.
      item_id: e.g. "variant_qa-00012".
      task: the viewer request and its ground truth (for prompt robustness, with the tool-order
        constraint's `first` call already in `gold_calls`).
      perturbation: "none", "heldout_harness", one of `TOOL_PERTURBATIONS`, or "prompt_constraints".
      harness_seed: seed of the harness draw (unused for "none" and "tool_failure").
      fault_rates: injected fault rates of the environment ({} for none).
      constraints: constraints added to the prompt (prompt robustness only).
    """

    suite: str
    item_id: str
    task: Task
    perturbation: str = "none"
    harness_seed: int = 0
    fault_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    constraints: tuple[Constraint, ...] = ()

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics the paper reports for this item's suite."""
        return SUITE_METRICS[self.suite]


def training_messages(world: World, n: int, seeds: Iterable[int]) -> frozenset[str]:
    """The viewer messages of the first `n` tasks of each training seed stream (to keep out of eval)."""
    return frozenset(sample_task(world, seed, i).message for seed in seeds for i in range(n))


def _held_out_tasks(
    world: World, suite: str, n: int, exclude: frozenset[str], intents: tuple[str, ...] | None, seed: int
) -> list[Task]:
    tasks, index, stream = [], 0, SUITE_SEEDS[suite] + 100_000 * seed
    seen: set[str] = set()
    while len(tasks) < n:
        task = sample_task(world, stream, index, intents)
        index += 1
        if task.message in exclude or task.message in seen:
            continue
        if index > 50 * n + 1000:
            raise RuntimeError(f"{suite}: found only {len(tasks)} of {n} tasks not seen in training")
        seen.add(task.message)
        tasks.append(task)
    return tasks


def _with_tool_order(task: Task, first: str, then: str) -> Task:
    """`task` whose gold plan calls `first` (same product) in the round before the group that calls `then`."""
    groups: list[tuple] = []
    for group in task.gold_calls:
        needs = [dict(args) for impl, args in group if impl == then]
        already = any(impl == first for g in groups for impl, _ in g)
        if needs and not already:
            groups.append(tuple((first, {"product_id": a["product_id"]}) for a in needs))
        groups.append(group)
    return dataclasses.replace(task, gold_calls=tuple(groups))


def _prompt_item(task: Task, rng: random.Random) -> tuple[Task, tuple[Constraint, ...]]:
    picked = rng.sample(INSTRUCTION_POOL, rng.choice((1, 2)))
    while len({c.id for c in picked}) < len(picked):  # never two start/end phrases at once
        picked = rng.sample(INSTRUCTION_POOL, len(picked))
    planned = {impl for group in task.gold_calls for impl, _ in group}
    orders = [(f, t) for f, t in TOOL_ORDER_POOL if t in planned and f not in planned]
    if orders:
        first, then = rng.choice(orders)
        picked.append(Constraint("tool_order", {"first": first, "then": then}))
        task = _with_tool_order(task, first, then)
    return task, tuple(picked)


def build_suite(world: World, suite: str, n: int, *, seed: int = 0, exclude: frozenset[str] = frozenset()) -> list[EvalItem]:
    """The first `n` items of `suite`.

    Args:
      world: the simulated catalog.
      suite: one of `SUITES`.
      n: number of items (the paper: 978 / 978 / 2023 for tool + prompt robustness, see `PAPER_SIZES`).
      seed: selects a different item stream (multi-seed evaluation).
      exclude: viewer messages to keep out (the training tasks', see `training_messages`).
    Returns:
      items in a deterministic order; same arguments -> same items.
    Raises:
      ValueError: unknown suite or n < 0.
    """
    if suite not in SUITES:
        raise ValueError(f"suite: unknown {suite!r}; expected one of {SUITES}")
    if n < 0:
        raise ValueError(f"n: expected >= 0, got {n}")
    intents = TOOL_INTENTS if suite in ("tool_robustness", "prompt_robustness") else None
    items = []
    for i, task in enumerate(_held_out_tasks(world, suite, n, exclude, intents, seed)):
        rng = random.Random(f"{suite}:{seed}:{i}")
        item = EvalItem(suite=suite, item_id=f"{suite}-{i:05d}", task=task, harness_seed=rng.randrange(2**31))
        if suite == "variant_qa":
            item = dataclasses.replace(item, perturbation="heldout_harness")
        elif suite == "tool_robustness":
            kind = TOOL_PERTURBATIONS[i % len(TOOL_PERTURBATIONS)]
            rates = dict(TOOL_FAILURE_RATES) if kind == "tool_failure" else {}
            item = dataclasses.replace(item, perturbation=kind, fault_rates=rates)
        elif suite == "prompt_robustness":
            new_task, constraints = _prompt_item(task, rng)
            item = dataclasses.replace(item, task=new_task, perturbation="prompt_constraints", constraints=constraints)
        items.append(item)
    return items


def item_harness(item: EvalItem, original: HarnessState) -> HarnessState:
    """The harness item `item` runs under, rebuilt from `original` and the item's seeds.

    Raises:
      ValueError: an unknown perturbation.
    """
    rng = random.Random(item.harness_seed)
    if item.perturbation in ("none", "tool_failure"):
        return original
    if item.perturbation == "heldout_harness":
        return compose(original, rng, HSAConfig(), "heldout")[0]
    if item.perturbation == "schema_variant":
        cfg = HSAConfig(allowed=("rename_tools", "restructure_schemas"), default_p=1.0)
        return compose(original, rng, cfg, "train")[0]
    if item.perturbation == "distractor_tools":
        cfg = HSAConfig(allowed=("distractor_tools",), default_p=1.0, params={"distractor_tools": {"count": (2, 4)}})
        return compose(original, rng, cfg, "train")[0]
    if item.perturbation == "prompt_constraints":
        section = PromptSection(key="constraints", title=EXTRA_SECTION_TITLE, text="", constraints=item.constraints)
        return original.replace(sections=(*original.sections, section), version=f"{original.version}+{item.item_id}")
    raise ValueError(f"item {item.item_id}: unknown perturbation {item.perturbation!r}")


def item_env_config(item: EvalItem, base: EnvConfig | None = None) -> EnvConfig:
    """The environment config of `item`: `base` (default `EnvConfig()`) with the item's fault rates."""
    base = base or EnvConfig()
    return dataclasses.replace(base, fault_rates=dict(item.fault_rates) or dict(base.fault_rates))


def item_to_dict(item: EvalItem) -> dict[str, Any]:
    """`item` as a JSON-serialisable dict; inverse of `item_from_dict`."""
    return {
        "suite": item.suite,
        "item_id": item.item_id,
        "task": task_to_dict(item.task),
        "perturbation": item.perturbation,
        "harness_seed": item.harness_seed,
        "fault_rates": dict(item.fault_rates),
        "constraints": [{"id": c.id, "kwargs": dict(c.kwargs)} for c in item.constraints],
    }


def item_from_dict(data: Mapping[str, Any]) -> EvalItem:
    """The `EvalItem` stored by `item_to_dict`.

    Raises:
      ValueError: a missing key or an unknown suite, naming it.
    """
    missing = [k for k in ("suite", "item_id", "task") if k not in data]
    if missing:
        raise ValueError(f"eval item record lacks {missing}; has {sorted(data)}")
    if data["suite"] not in SUITES:
        raise ValueError(f"eval item {data['item_id']!r}: unknown suite {data['suite']!r}; expected one of {SUITES}")
    return EvalItem(
        suite=data["suite"],
        item_id=data["item_id"],
        task=task_from_dict(data["task"]),
        perturbation=data.get("perturbation", "none"),
        harness_seed=int(data.get("harness_seed", 0)),
        fault_rates=dict(data.get("fault_rates", {})),
        constraints=tuple(Constraint(c["id"], dict(c.get("kwargs", {}))) for c in data.get("constraints", ())),
    )
