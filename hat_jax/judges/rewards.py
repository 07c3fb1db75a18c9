"""RL rewards from the rule judges: one component per objective (for GDPO) and a weighted sum (for GRPO).

Variant: the HAT report, arXiv 2608.15763 (TaoLive, 2026), "Training, three stages", splits the
HSA-RL reward into Accuracy, Effectiveness, Tool Rationality and Skill Selection, "plus a
chain-of-thought length penalty with a linear zone between 100 and 200 tokens". GDPO (Liu et al.,
NVIDIA, arXiv 2601.05242) normalises each reward component within its group before the weighted
sum, so a length term kept as its own component is not folded into accuracy before normalisation;
`reward_components` therefore returns the five components separately, and `weighted_reward` is the
GRPO (DeepSeekMath, arXiv 2402.03300) sum-then-normalise reward R = sum_k w_k r_k.

CoT length penalty: 0 up to `free` reasoning tokens, linear to -1 at `zero_at`,
-1 beyond; the shape of DAPO's overlong reward shaping (Yu et al., arXiv 2503.14476: R_len = 0 up to
L_max - L_c, linear to -1 at L_max; here L_max - L_c = free and L_max = zero_at). With one count per assistant turn (the paper
reports tool-call CoT and reply CoT separately) the component is the mean of the per-turn penalties
(`cot_aggregate="mean"`) or the worst one ("min").

Default weights are our choice (the paper gives none): 1 for Accuracy and Effectiveness, 0.5 for
Tool Rationality, Skill Selection and the length penalty.

Accuracy is not paid for silence without cause (`Judgement.silent_without_cause`), and, with
`accuracy_needs_intent`, not for any reply of Effectiveness 0 when no gold call failed: a refusal of an
answerable question states no wrong fact, so the judge's Accuracy is 1, and at small scale HSA-RL learned to
give it (docs/tuning.md, "HSA-RL at small"). Our choice, not the paper's; the evaluation's Accuracy is unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from hat_jax.judges.rules import Judgement
from hat_jax.sim.types import Episode

COMPONENTS: tuple[str, ...] = ("accuracy", "effectiveness", "tool_rationality", "skill_selection", "cot_length")


def cot_length_penalty(n_tokens: int, free: int = 100, zero_at: int = 200) -> float:
    """Length penalty of one reasoning block: 0 if n <= free, -(n - free)/(zero_at - free) up to -1.

    Args:
      n_tokens: reasoning tokens of one turn (>= 0).
      free: tokens allowed without penalty.
      zero_at: tokens at which the penalty reaches -1 (and stays there).
    Raises:
      ValueError: n_tokens < 0, free < 0, or zero_at <= free.
    """
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    if free < 0 or zero_at <= free:
        raise ValueError(f"need 0 <= free < zero_at, got free={free}, zero_at={zero_at}")
    if n_tokens <= free:
        return 0.0
    return -min(1.0, (n_tokens - free) / (zero_at - free))


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Reward settings.

    Attributes:
      weights: component -> weight for `weighted_reward` (keys from `COMPONENTS`).
      cot_free: reasoning tokens without penalty (paper: 100).
      cot_zero_at: reasoning tokens at which the penalty is -1 (paper: 200).
      cot_aggregate: "mean" or "min" over per-turn penalties.
      accuracy_needs_intent: pay the accuracy component only for an episode on the viewer's intent
        (`Judgement.off_intent_without_cause` False); silence without cause is never paid.
    """

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("accuracy_needs_intent",)  # stage names predating it stay

    weights: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {
            "accuracy": 1.0, "effectiveness": 1.0, "tool_rationality": 0.5, "skill_selection": 0.5, "cot_length": 0.5,
        }
    )
    cot_free: int = 100
    cot_zero_at: int = 200
    cot_aggregate: str = "mean"
    accuracy_needs_intent: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.accuracy_needs_intent, bool):
            raise ValueError(f"RewardConfig.accuracy_needs_intent = {self.accuracy_needs_intent!r}: expected a bool")
        unknown = sorted(set(self.weights) - set(COMPONENTS))
        if unknown:
            raise ValueError(f"RewardConfig.weights: unknown components {unknown}; known: {COMPONENTS}")
        if self.cot_aggregate not in ("mean", "min"):
            raise ValueError(f"RewardConfig.cot_aggregate must be 'mean' or 'min', got {self.cot_aggregate!r}")
        cot_length_penalty(0, self.cot_free, self.cot_zero_at)  # validates free/zero_at


def reward_components(
    judgement: Judgement, reasoning_tokens: int | Sequence[int], config: RewardConfig = RewardConfig()
) -> dict[str, float]:
    """The five reward components of one rollout.

    Args:
      judgement: `judge_episode` of the rollout.
      reasoning_tokens: reasoning tokens of the whole rollout (int) or one count per assistant turn.
      config: penalty shape and aggregation.
    Returns:
      {"accuracy", "effectiveness", "tool_rationality", "skill_selection": in [0, 1];
       "cot_length": in [-1, 0]}. The accuracy component is 0 for an episode that stayed silent
      without cause (`Judgement.silent_without_cause`): the judge's Accuracy says no wrong fact was
      stated, but a policy must not learn that silence earns the accuracy reward (seen in a tiny RL run:
      81% of episodes ended without a reply at Accuracy 0.875).
    """
    counts = [reasoning_tokens] if isinstance(reasoning_tokens, int) else list(reasoning_tokens)
    pens = [cot_length_penalty(n, config.cot_free, config.cot_zero_at) for n in counts] or [0.0]
    cot = min(pens) if config.cot_aggregate == "min" else sum(pens) / len(pens)
    unpaid = judgement.silent_without_cause or (config.accuracy_needs_intent and judgement.off_intent_without_cause)
    return {
        "accuracy": 0.0 if unpaid else float(judgement.accuracy),
        "effectiveness": float(judgement.effectiveness),
        "tool_rationality": float(judgement.tool_rationality),
        "skill_selection": float(judgement.skill_selection),
        "cot_length": float(cot),
    }


def weighted_reward(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """R = sum_k w_k r_k over the components named in `weights` (GRPO's scalar reward).

    Raises:
      KeyError: a weighted component missing from `components`, naming it.
    """
    missing = [k for k in weights if k not in components]
    if missing:
        raise KeyError(f"weighted_reward: components {missing} missing; have {sorted(components)}")
    return float(sum(w * components[k] for k, w in weights.items()))


def reasoning_token_counts(episode: Episode, count_tokens: Callable[[str], int]) -> list[int]:
    """Reasoning tokens of every assistant turn of `episode` (its `reasoning_content`), in order.

    Args:
      episode: the rollout.
      count_tokens: text -> token count, e.g. `lambda s: len(tokenizer.encode(s))`.
    """
    return [count_tokens(m.get("reasoning_content") or "") for m in episode.messages if m.get("role") == "assistant"]
