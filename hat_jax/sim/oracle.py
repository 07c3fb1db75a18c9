"""The oracle teacher: the embedded "strong model" that writes ideal live-stream trajectories.

The HAT report, arXiv 2608.15763 (TaoLive, 2026), "Training, three stages", stage 1 (HSA-SFT): a
strong teacher runs in the live-stream environment under the current harness, rejection sampling keeps
what the judges accept, and the compact model is supervised on it. The oracle is that teacher for
hat-jax: a `Policy` that reads the task's ground truth (intent, skill key, gold calls) and the *current*
harness, and writes the next assistant turn.

Variant implemented and why:
- Stateless: each `act` re-reads the conversation (tool calls made, their results, hook feedback), so
  the same messages always give the same turn; every draw is from a `random.Random` seeded with
  (config.seed, task.seed, task id), plus the turn for a tool turn's wording (`act`, `noise_plan`).
- Names only from the harness: the skill id from `harness.skill_by_key(task.skill_key)`, the skill
  tool `harness.skill_tool`, each world call's surface name from `harness.tool_by_impl(impl)` and
  its surface arguments built along `Tool.arg_paths` (`surface_of`).
- Plan (`plan`): turn 1 loads the skill; then the task's gold call groups in order (a group's calls in one
  turn), with a `first` call inserted for a prompt `tool_order` constraint (`_apply_tool_order`). Ids are
  read from earlier results: a `product_id` is used only once an ok tool result contains it, a `sku_id` once
  a result contains it or it is composable from a known product id and the viewer's words; else the oracle
  stops calling tools.
- Failures: a transient failure (service error, timeout, empty) is retried (alone, in the next turn)
  when the harness's PostToolUseFailure hooks would answer "retry" (`run_hooks` predicts exactly what
  the environment does) and a round is left; otherwise the reply says honestly that the information
  cannot be confirmed now (no invented facts).
- Reply (`hat_jax.sim.oracle_replies.compose_reply`): built only from values in ok tool results, with the
  right behaviour per intent, then every reply constraint of the prompt applied.
- Noise (`OracleConfig` rates, drawn once per episode): the mistakes rejection sampling must catch.

`final_behaviour_only` post-processes such trajectories for SFT (see its docstring).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.harness.hooks import HOOK_FEEDBACK_PREFIX, HookContext, first_action, run_hooks
from hat_jax.harness.state import HarnessState, Tool
from hat_jax.sim import oracle_replies as replies
from hat_jax.sim.executor import canonical_arguments
from hat_jax.sim.types import Episode, Task

TRANSIENT_ERRORS = ("service_error", "timeout")  # error types worth a retry ("empty" results too)
NOISE_KINDS = ("skip_skill", "wrong_tool", "skip_tool", "wrong_fact", "ungrounded_promise", "over_length")
_ID_ARGS = ("product_id", "sku_id")
_PRODUCT_ID_IMPLS = ("get_product_detail", "get_price", "get_promotions", "get_after_sales_policy")


@dataclasses.dataclass(frozen=True)
class OracleConfig:
    """Oracle options. All noise rates default to 0 (the ideal teacher); `DEFAULT_NOISE` is the noisy one.

    Each noise rate is drawn once per episode (`OracleTeacher.noise_plan`); a Stop hook that blocks a noisy reply
    gets a clean revision (the "hook forced a retry" trajectories of the HAT report).

    Attributes:
      p_skip_skill: answer without loading the skill.
      p_wrong_tool: replace one product-id call with a different world tool (the reply then states the
        missing fact from the task, ungrounded).
      p_skip_tool: drop one non-search gold call (likewise: the missing fact is stated from the task, ungrounded).
      p_wrong_fact: state one fact with a wrong value.
      p_ungrounded_promise: add a refund/compensation promise no tool supports.
      p_over_length: pad the reply beyond the prompt's length limit.
      retry_keep_full_share: share of hook-retry trajectories that keep the full retry in
        `final_behaviour_only` (the HAT report: "a small share").
      reasoning: "short" (1-2 Chinese sentences per turn) or "none" (empty reasoning).
      max_tool_rounds: tool rounds the environment allows (`EnvConfig.max_tool_rounds`).
      seed: salt for every draw (`with_seed` changes it between rejection-sampling attempts).
    """

    p_skip_skill: float = 0.0
    p_wrong_tool: float = 0.0
    p_skip_tool: float = 0.0
    p_wrong_fact: float = 0.0
    p_ungrounded_promise: float = 0.0
    p_over_length: float = 0.0
    retry_keep_full_share: float = 0.1
    reasoning: str = "short"
    max_tool_rounds: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for kind in NOISE_KINDS:
            p = getattr(self, f"p_{kind}")
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"OracleConfig.p_{kind} must be in [0, 1], got {p}")
        if not 0.0 <= self.retry_keep_full_share <= 1.0:
            raise ValueError(f"OracleConfig.retry_keep_full_share must be in [0, 1], got {self.retry_keep_full_share}")
        if self.reasoning not in ("short", "none"):
            raise ValueError(f"OracleConfig.reasoning must be 'short' or 'none', got {self.reasoning!r}")
        if self.max_tool_rounds < 1:
            raise ValueError(f"OracleConfig.max_tool_rounds must be >= 1, got {self.max_tool_rounds}")


# The noisy teacher of the SFT data step: about a quarter of episodes draw at least one mistake (some
# are no-ops for the task, e.g. a wrong tool on a task without tools); under the production harness
# rejection sampling (Accuracy 1 and Effectiveness 1) rejects about 12% of its episodes.
DEFAULT_NOISE = OracleConfig(p_skip_skill=0.04, p_wrong_tool=0.06, p_skip_tool=0.06, p_wrong_fact=0.08,
                             p_ungrounded_promise=0.04, p_over_length=0.05)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Call:
    """One executed call as the oracle reads it back from the conversation."""

    turn: int
    name: str
    impl: str
    canonical: dict
    result: dict
    status: str  # "ok", "error", "timeout", "empty", "invalid_arguments", "unknown_tool"
    error_type: str


def _status_of(result: Any) -> tuple[str, str]:
    """(status, error type) of a tool result payload as the executor writes it."""
    if not isinstance(result, Mapping):
        return "ok", ""
    body = {k: v for k, v in result.items() if k != "hook"}
    if not body:
        return "empty", "empty"
    err = body.get("error")
    if isinstance(err, Mapping):
        kind = str(err.get("type", "error"))
        return (kind if kind in ("timeout", "invalid_arguments", "unknown_tool") else "error"), kind
    return "ok", ""


def surface_of(tool: Tool, canonical: Mapping[str, Any]) -> dict:
    """Surface arguments for canonical ones, nested along `Tool.arg_paths` (nested dicts for paths longer than one
    key; canonical names kept when the tool has no arg_paths; canonical arguments without a path are dropped)."""
    out: dict[str, Any] = {}
    for canon, value in canonical.items():
        path = tuple(tool.arg_paths[canon]) if tool.arg_paths else (canon,)
        if tool.arg_paths and canon not in tool.arg_paths:
            continue
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def read_calls(messages: Sequence[Mapping[str, Any]], harness: HarnessState) -> list[_Call]:
    """Every executed call in `messages` (assistant tool calls paired in order with the tool messages)."""
    calls, pending, turn = [], [], 0
    for msg in messages:
        if msg.get("role") == "assistant":
            turn += 1
            pending = [c["function"] for c in msg.get("tool_calls") or []]
        elif msg.get("role") == "tool" and pending:
            fn = pending.pop(0)
            try:
                result = json.loads(msg.get("content") or "{}")
            except ValueError:
                result = {"error": {"type": "unparsed", "message": str(msg.get("content"))}}
            tool = harness.tool(fn["name"])
            args = fn.get("arguments") if isinstance(fn.get("arguments"), Mapping) else {}
            status, kind = _status_of(result)
            calls.append(_Call(turn, fn["name"], tool.impl if tool else "", canonical_arguments(tool, args) if tool else {},
                               result if isinstance(result, dict) else {"value": result}, status, kind))  # fmt: skip
    return calls


def _skill_arg(tool: Tool) -> str:
    """The canonical argument of the skill loader (the executor's convention: "skill")."""
    if "skill" in tool.arg_paths or not tool.arg_paths:
        return "skill"
    return next(iter(tool.arg_paths))


def _same(call: _Call, impl: str, canonical: Mapping[str, Any]) -> bool:
    return call.impl == impl and all(call.canonical.get(k) == v for k, v in canonical.items())


def _known_ids(calls: Sequence[_Call], user_text: str) -> tuple[set[str], str]:
    """Ids that ok results contain (walked recursively), and the viewer text (for composable SKU ids)."""
    ids: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, str):
            ids.add(v)
        elif isinstance(v, Mapping):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for c in calls:
        if c.status == "ok":
            walk(c.result)
    return ids, user_text


def _id_known(name: str, value: Any, known: tuple[set[str], str]) -> bool:
    """Whether the oracle may use id `value` yet: it is in an ok tool result, or (a `sku_id`) it is composable from
    a known product id and the two variant values the viewer wrote ("PID-V1-V2")."""
    ids, text = known
    if value in ids:
        return True
    if name == "sku_id" and isinstance(value, str) and value.count("-") == 2:
        pid, v1, v2 = value.split("-")
        return pid in ids and v1 in text and v2 in text
    return False


class OracleTeacher:
    """The oracle teacher `Policy` (see the module docstring).

    Args:
      world: the `hat_jax.sim.catalog.World` the tasks were drawn from (used only to find a SKU's
        product when a tool_order constraint needs an extra call).
      config: options and noise rates.
    """

    def __init__(self, world: Any, config: OracleConfig | None = None):
        self.world = world
        self.config = config or OracleConfig()

    def with_seed(self, seed: int) -> OracleTeacher:
        """A copy whose draws use `seed` (rejection-sampling attempts)."""
        return OracleTeacher(self.world, dataclasses.replace(self.config, seed=seed))

    def sft_messages(self, episode: Episode) -> tuple[dict, ...]:
        """`final_behaviour_only` with this oracle's `retry_keep_full_share` and seed."""
        return final_behaviour_only(episode, keep_full_share=self.config.retry_keep_full_share, seed=self.config.seed)

    # ------------------------------------------------------------------ noise and plan
    def noise_plan(self, task: Task) -> dict[str, Any]:
        """The episode's mistakes: kind -> a draw in [0, 1) used to pick where (absent = no mistake).

        One draw per kind from `random.Random` seeded with (config.seed, task.seed, task id), so every
        turn of the episode sees the same plan. "skip_tool" and "wrong_tool" exclude each other
        (skip wins) and touch only non-search calls.
        """
        rng = random.Random(f"oracle-noise:{self.config.seed}:{task.seed}:{task.task_id}")
        out = {}
        for kind in NOISE_KINDS:
            hit = rng.random() < getattr(self.config, f"p_{kind}")
            where = rng.random()
            if hit:
                out[kind] = where
        return out

    def plan(self, task: Task, harness: HarnessState) -> list[list[tuple[str, dict]]]:
        """The call groups the oracle makes, as (impl, canonical args), skill load first."""
        noise = self.noise_plan(task)
        groups = [[(impl, dict(args)) for impl, args in group] for group in task.gold_calls]
        groups = self._apply_tool_order(groups, harness)
        flat = [(g, i) for g, group in enumerate(groups) for i, (impl, _) in enumerate(group) if impl != "search_products"]
        if flat and "skip_tool" in noise:
            g, i = flat[int(noise["skip_tool"] * len(flat))]
            del groups[g][i]
        elif "wrong_tool" in noise:
            cands = [(g, i) for g, i in flat if "product_id" in groups[g][i][1]]
            if cands:
                g, i = cands[int(noise["wrong_tool"] * len(cands))]
                impl, args = groups[g][i]
                others = [x for x in _PRODUCT_ID_IMPLS if x != impl and harness.tool_by_impl(x) is not None]
                if others:
                    groups[g][i] = (others[int(noise["wrong_tool"] * 7919) % len(others)], {"product_id": args["product_id"]})
        groups = [g for g in groups if g]
        skill = harness.skill_by_key(task.skill_key) if task.skill_key else None
        skill_tool = harness.tool(harness.skill_tool)
        if skill is not None and skill_tool is not None and "skip_skill" not in noise:
            groups.insert(0, [(skill_tool.impl, {_skill_arg(skill_tool): skill.name})])
        return groups

    def _apply_tool_order(self, groups: list[list[tuple[str, dict]]], harness: HarnessState) -> list[list[tuple[str, dict]]]:
        """Inserts a `first` call before a planned `then` call that has none before it (prompt tool_order)."""
        for c in harness.constraints():
            if c.id != "tool_order":
                continue
            first, then = c.kwargs["first"], c.kwargs["then"]
            for g, group in enumerate(groups):
                then_call = next((args for impl, args in group if impl == then), None)
                if then_call is None:
                    continue
                if any(impl == first for grp in groups[: g + 1] for impl, _ in grp):
                    break
                pid = then_call.get("product_id")
                if pid is None and "sku_id" in then_call and self.world.sku(then_call["sku_id"]) is not None:
                    pid = self.world.sku(then_call["sku_id"])[0].product_id
                if pid is not None:
                    groups.insert(g, [(first, {"product_id": pid})])
                break
        return groups

    # ------------------------------------------------------------------ acting
    def act(self, messages: list[dict], harness: HarnessState, task: Task | None) -> dict:
        """The next assistant turn (see the module docstring).

        Raises:
          ValueError: `task` is None (the oracle needs the ground truth).
        """
        if task is None:
            raise ValueError("OracleTeacher.act needs the task (ground truth); got task=None")
        turn = sum(m.get("role") == "assistant" for m in messages) + 1
        rng = random.Random(f"oracle:{self.config.seed}:{task.seed}:{task.task_id}:{turn}")
        noise = self.noise_plan(task)
        calls = read_calls(messages, harness)
        last = messages[-1] if messages else {}
        if last.get("role") == "user" and str(last.get("content", "")).startswith(HOOK_FEEDBACK_PREFIX):
            return self._reply(task, harness, calls, rng, noise, revision=str(last["content"]))
        rounds_used = sum(  # world-tool rounds, as the environment counts them (skill-only turns are free)
            1
            for m in messages
            if m.get("role") == "assistant"
            and any(c["function"]["name"] != harness.skill_tool for c in m.get("tool_calls") or ())
        )
        user_text = next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")
        known = _known_ids(calls, user_text)
        for group in self.plan(task, harness):
            todo = []
            for impl, args in group:
                tries = [i for i, c in enumerate(calls) if _same(c, impl, args)]
                if any(calls[i].status == "ok" for i in tries):
                    continue
                if tries:
                    if not self._may_retry(tries[-1], calls, harness):
                        return self._reply(task, harness, calls, rng, noise, failed=impl)
                elif harness.tool_by_impl(impl) is None or not (
                    self._first_world_group(task, impl, args)
                    or all(_id_known(k, args[k], known) for k in _ID_ARGS if k in args)
                ):
                    return self._reply(task, harness, calls, rng, noise, failed=impl)
                todo.append((impl, args, bool(tries)))
            if not todo:
                continue
            if rounds_used >= self.config.max_tool_rounds:
                return self._reply(task, harness, calls, rng, noise, failed=todo[0][0])
            retry = [t for t in todo if t[2]]
            return self._tool_turn(task, harness, retry or todo, rng, retry=bool(retry))
        return self._reply(task, harness, calls, rng, noise)

    @staticmethod
    def _first_world_group(task: Task, impl: str, args: Mapping[str, Any]) -> bool:
        """True when (impl, args) is in the task's first gold group (nothing before it can name an id)."""
        return bool(task.gold_calls) and any(i == impl and dict(a) == dict(args) for i, a in task.gold_calls[0])

    def _may_retry(self, index: int, calls: Sequence[_Call], harness: HarnessState) -> bool:
        """Whether the harness's PostToolUseFailure hooks allowed another try after `calls[index]` failed.

        Only transient failures (service error, timeout, empty result) are retried; `attempt` counts the
        calls of that tool name up to this one, as the environment does.
        """
        call = calls[index]
        if call.status == "empty" or call.error_type in TRANSIENT_ERRORS:
            attempt = sum(1 for c in calls[: index + 1] if c.name == call.name)
            ctx = HookContext("PostToolUseFailure", harness, tool_name=call.name, status=call.status, attempt=attempt)
            decision = first_action(run_hooks(harness, "PostToolUseFailure", ctx))
            return decision is not None and decision.action == "retry"
        return False

    def _tool_turn(self, task: Task, harness: HarnessState, todo: list, rng: random.Random, *, retry: bool) -> dict:
        tool_calls, names = [], []
        for impl, args, _ in todo:
            tool = harness.tool_by_impl(impl)
            tool_calls.append({"type": "function", "function": {"name": tool.name, "arguments": surface_of(tool, args)}})
            names.append(tool.name)
        reasoning = ""
        if self.config.reasoning == "short":
            reasoning = replies.tool_reasoning(task, todo, names, retry=retry, rng=rng)
        return {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": tool_calls}

    def _reply(self, task: Task, harness: HarnessState, calls: Sequence[_Call], rng: random.Random,
               noise: Mapping[str, Any], *, failed: str | None = None, revision: str | None = None) -> dict:
        ok = [c for c in calls if c.status == "ok"]
        # One stream for the reply, whatever the turn: a retried or revised episode words its reply like a clean one.
        rng = random.Random(f"oracle-reply:{self.config.seed}:{task.seed}:{task.task_id}")
        text, note = replies.compose_reply(task, harness, ok, noise, rng, failed=failed, revision=revision)
        reasoning = note if self.config.reasoning == "short" else ""
        return {"role": "assistant", "content": text, "reasoning_content": reasoning}


# ---------------------------------------------------------------------- SFT post-processing
def final_behaviour_only(episode: Episode, *, keep_full_share: float = 0.1, seed: int = 0) -> tuple[dict, ...]:
    """The episode's messages with hook-forced retries collapsed to the final correct behaviour.

    The HAT report, stage 1 (HSA-SFT): "for trajectories where a Hook forced a retry, most keep only
    the final correct behaviour; a small share keeps the full retry to teach recovery". Here:
    - a failed tool call that a later turn retried with success: the failed result (with its hook
      feedback) is replaced by the successful result and the retry turn (assistant message and its
      tool messages) is dropped, provided every call in that turn is such a retry; a chain of failed
      retries ending in success collapses the same way; a call that never succeeded stays as it is;
    - a reply blocked by a Stop hook: the blocked reply and the feedback message are dropped, the
      revision stays.
    With probability `keep_full_share` (one draw from `random.Random` seeded with seed, task id and
    task seed) the messages are returned unchanged. Episodes without retries are returned unchanged.

    Args:
      episode: a finished episode (`messages` and `tool_calls` as the environment recorded them).
      keep_full_share: share of retry trajectories kept whole (`OracleConfig.retry_keep_full_share`).
      seed: salt of the draw.
    Returns:
      the messages to train on (copies of the dicts).
    Raises:
      ValueError: the number of tool messages differs from the number of recorded calls.
    """
    messages = [dict(m) for m in episode.messages]
    tool_idx = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
    if len(tool_idx) != len(episode.tool_calls):
        raise ValueError(f"episode {episode.task.task_id}: {len(tool_idx)} tool messages but {len(episode.tool_calls)} recorded calls")
    rng = random.Random(f"keep-full-retry:{seed}:{episode.task.task_id}:{episode.task.seed}")
    if rng.random() < keep_full_share:
        return tuple(messages)
    drop: set[int] = set()
    # Stop-hook revisions: assistant reply followed by a hook feedback user message.
    for i, m in enumerate(messages[:-1]):
        nxt = messages[i + 1]
        if m.get("role") == "assistant" and not m.get("tool_calls") and nxt.get("role") == "user" \
                and str(nxt.get("content", "")).startswith(HOOK_FEEDBACK_PREFIX):  # fmt: skip
            drop.update((i, i + 1))
    # Tool retries: map each tool message to its record and its assistant turn.
    owner = {}
    current = None
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            current = i
        elif m.get("role") == "tool":
            owner[i] = current
    records = dict(zip(tool_idx, episode.tool_calls))
    first_failed: dict[tuple, int] = {}  # call key -> tool message index of the first failure in a chain
    chain: dict[tuple, list[int]] = {}
    for i in tool_idx:
        rec = records[i]
        key = (rec.name, json.dumps(rec.arguments, sort_keys=True, ensure_ascii=False, default=str))
        if rec.status == "ok" and key in first_failed:
            turn_tools = [j for j in tool_idx if owner[j] == owner[i]]
            if all(j in chain.get(_key(records[j]), []) or j == i or _key(records[j]) in first_failed for j in turn_tools):
                messages[first_failed[key]] = {**messages[first_failed[key]], "content": messages[i]["content"]}
                drop.update(chain[key][1:])
                drop.update(owner[j] for j in chain[key][1:])
                drop.add(i)
                drop.add(owner[i])
            first_failed.pop(key)
            chain.pop(key)
        elif rec.status in ("error", "timeout", "empty"):
            first_failed.setdefault(key, i)
            chain.setdefault(key, []).append(i)
    return tuple(m for i, m in enumerate(messages) if i not in drop)


def _key(rec: Any) -> tuple:
    return (rec.name, json.dumps(rec.arguments, sort_keys=True, ensure_ascii=False, default=str))
