"""Harness-State Augmentation (HSA): task-preserving transforms of a `HarnessState`.

Variant implemented and why: HSA as the HAT report, arXiv 2608.15763 (TaoLive, 2026), "The system",
defines it (task-preserving transforms of skill identifiers and content, tool schemas, prompt
structure and hooks). Each transform is a pure function `(harness, rng, ...) -> (harness', NameMap)`
that keeps the bindings to the world (`Tool.impl`, `Tool.arg_paths` meaning, `Skill.key`) and
changes only what the model reads:
- `rename_skills`: new skill ids (lowercase-hyphen), the skill tool's enum and every mention follow;
- `rewrite_skills`: skill bodies reordered (blocks, unordered bullets), re-bulleted, paraphrased;
- `rename_tools`: new tool and argument names in one naming style; arg_paths, allowed_tools, hook
  matchers, the skill tool and every mention in descriptions, bodies and prompt text follow;
- `restructure_schemas`: property order, canonical args nested under an object property (arg_paths
  follow), reworded descriptions, optional distractor arguments, tool registry order;
- `distractor_tools`, `distractor_skills`: tools no task needs (impl `DISTRACTOR_PREFIX + name`),
  skills with key "";
- `restyle_prompt`: heading style, section order (persona first), titles, paraphrased text;
- `hook_params`: retry max_attempts and reply max_chars (a tighter limit tightens the prompt's
  "max_chars" constraint too); this one changes behaviour (`behaviour_changed`), so the pipeline
  re-rolls such trajectories with the oracle.
`compose` applies them with per-transform probabilities from `HSAConfig`. Held-out families
(`hsa_vocab`: dotted/PascalCase tool names, reserved word combinations, the bracket heading style with
a persona-last order) are never drawn with split="train" and always with split="heldout".
The transforms live in hsa_transforms.py, names and pools in hsa_vocab.py, `NameMap`,
`rewrite_messages`, `behaviour_changed` and `check_harness` in hsa_rewrite.py; this module composes
them and re-exports the public API.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping

from hat_jax.harness import hsa_vocab as V
from hat_jax.harness.hsa_rewrite import HSAError, NameMap, behaviour_changed, check_harness, rewrite_messages
from hat_jax.harness.hsa_transforms import (
    distractor_skills,
    distractor_tools,
    hook_params,
    rename_skills,
    rename_tools,
    restructure_schemas,
    restyle_prompt,
    rewrite_skills,
)
from hat_jax.harness.state import HarnessState

__all__ = [
    "TRANSFORMS",
    "HELDOUT_FORCED",
    "HSAConfig",
    "HSAError",
    "NameMap",
    "compose",
    "rewrite_messages",
    "behaviour_changed",
    "check_harness",
    "is_heldout_harness",
    "rename_skills",
    "rewrite_skills",
    "rename_tools",
    "restructure_schemas",
    "distractor_tools",
    "distractor_skills",
    "restyle_prompt",
    "hook_params",
]

TRANSFORMS: tuple[str, ...] = (
    "rename_skills",
    "rewrite_skills",
    "rename_tools",
    "restructure_schemas",
    "distractor_tools",
    "distractor_skills",
    "restyle_prompt",
    "hook_params",
)
HELDOUT_FORCED: frozenset[str] = frozenset({"rename_skills", "rename_tools", "restyle_prompt"})


@dataclasses.dataclass(frozen=True)
class HSAConfig:
    """Which HSA transforms `compose` applies, and how.

    Attributes:
      probs: transform name -> probability of applying it (each drawn independently); names missing
        from the mapping get `default_p`.
      default_p: probability of a transform not in `probs`.
      allowed: the transforms that may be applied at all (others are never applied).
      at_least_one: when no transform was drawn, apply one allowed transform chosen uniformly.
      n_distractor_tools, n_distractor_skills: inclusive (min, max) counts added.
      p_nest, p_distractor_args: per-tool probabilities inside `restructure_schemas`.
    """

    probs: Mapping[str, float] = dataclasses.field(default_factory=dict)
    default_p: float = 0.5
    allowed: tuple[str, ...] = TRANSFORMS
    at_least_one: bool = True
    n_distractor_tools: tuple[int, int] = (1, 3)
    n_distractor_skills: tuple[int, int] = (1, 2)
    p_nest: float = 0.5
    p_distractor_args: float = 0.5

    def __post_init__(self):
        for name in (*self.probs, *self.allowed):
            if name not in TRANSFORMS:
                raise ValueError(f"HSAConfig: unknown transform {name!r} (expected one of {TRANSFORMS})")
        for name, p in self.probs.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"HSAConfig.probs[{name!r}] = {p}: expected a probability in [0, 1]")
        for field in ("n_distractor_tools", "n_distractor_skills"):
            lo, hi = getattr(self, field)
            if not 0 <= lo <= hi:
                raise ValueError(f"HSAConfig.{field} = {(lo, hi)}: expected 0 <= min <= max")

    def p(self, name: str) -> float:
        """The probability of transform `name`."""
        return self.probs.get(name, self.default_p)


# ---------------------------------------------------------------- composition


def is_heldout_harness(h: HarnessState, original: HarnessState | None = None) -> bool:
    """True when `h` shows a held-out family: the bracket heading style, a dotted/PascalCase tool name,
    or a reserved word combination in a tool or skill name. Names that `original` already has are
    ignored (an original harness is never held out)."""
    if h.heading_style in V.HELDOUT_HEADING_STYLES and (original is None or original.heading_style != h.heading_style):
        return True
    old_names = {t.name for t in original.tools} | {s.name for s in original.skills} if original else set()
    for t in h.tools:
        if t.name in old_names:
            continue
        parsed = V.parse_tool_name(t.name)
        if V.name_style(t.name) in V.HELDOUT_TOOL_STYLES or (parsed and V.reserved_combo(parsed[1], *parsed[2])):
            return True
    for s in h.skills:
        parsed_skill = V.parse_skill_name(s.name)
        if s.name not in old_names and parsed_skill and V.reserved_combo(*parsed_skill[0], parsed_skill[1]):
            return True
    return False


def _apply(
    name: str, h: HarnessState, rng: random.Random, config: HSAConfig, heldout: bool
) -> tuple[HarnessState, NameMap]:
    """Runs transform `name` with its arguments from `config` and the split."""
    if name == "rename_skills":
        return rename_skills(h, rng, heldout=heldout)
    if name == "rewrite_skills":
        return rewrite_skills(h, rng)
    if name == "rename_tools":
        return rename_tools(h, rng, heldout=heldout)
    if name == "restructure_schemas":
        return restructure_schemas(h, rng, p_nest=config.p_nest, p_distractor_args=config.p_distractor_args)
    if name == "distractor_tools":
        return distractor_tools(h, rng, heldout=heldout, count=config.n_distractor_tools)
    if name == "distractor_skills":
        return distractor_skills(h, rng, heldout=heldout, count=config.n_distractor_skills)
    if name == "restyle_prompt":
        return restyle_prompt(h, rng, heldout=heldout)
    if name == "hook_params":
        return hook_params(h, rng)
    raise ValueError(f"unknown HSA transform {name!r}")


def _digest(h: HarnessState) -> str:
    return hashlib.sha1(repr(dataclasses.replace(h, version="")).encode()).hexdigest()[:8]


def compose(
    harness: HarnessState,
    rng: random.Random,
    config: HSAConfig = HSAConfig(),
    split: str = "train",
    *,
    exclude: tuple[str, ...] = (),
) -> tuple[HarnessState, NameMap, tuple[str, ...]]:
    """Applies a random subset of the HSA transforms in `TRANSFORMS` order.

    Args:
      harness: the harness to augment (usually the original one).
      rng: the draw's random source (the only randomness used).
      config: probabilities, allowed transforms, distractor counts.
      split: "train" (held-out families never drawn) or "heldout" (`HELDOUT_FORCED` transforms always
        applied, in their held-out families).
      exclude: transforms not to apply in this draw (e.g. "hook_params" when no oracle can re-roll).
    Returns:
      (new harness, name map from `harness` to it, names of the transforms that changed something).
      The new harness has version f"{old}+hsa.{digest}"; with no change it is `harness` itself. Its
      family tells what it is, not what was asked for: "hsa-heldout" exactly when
      `is_heldout_harness(new, harness)` is True, else "hsa-train". With split="heldout" and a
      config whose `allowed` (minus `exclude`) lacks some of `HELDOUT_FORCED`, a draw may show no
      held-out family; it is then labelled "hsa-train" (callers building held-out data should
      check the family, or allow the forced transforms).
    Raises:
      TypeError: `rng` is not a `random.Random`.
      ValueError: unknown split. HSAError: a transform produced an invalid harness (a bug).
    """
    if not isinstance(rng, random.Random):
        raise TypeError(f"compose: rng must be a random.Random (e.g. random.Random(seed)), got {type(rng).__name__}")
    if split not in ("train", "heldout"):
        raise ValueError(f"compose: split must be 'train' or 'heldout', got {split!r}")
    heldout = split == "heldout"
    allowed = [t for t in config.allowed if t not in exclude]
    draws = {t: rng.random() < config.p(t) for t in TRANSFORMS}
    chosen = [t for t in TRANSFORMS if t in allowed and (draws[t] or (heldout and t in HELDOUT_FORCED))]
    candidates = [t for t in allowed if config.p(t) > 0]
    if not chosen and config.at_least_one and candidates:
        chosen = [rng.choice(candidates)]
    h, name_map, applied = harness, NameMap(), []
    for name in TRANSFORMS:
        if name in chosen:
            new, nm = _apply(name, h, rng, config, heldout)
            if new != h:
                applied.append(name)
            h, name_map = new, name_map.then(nm)
    if not applied:
        return harness, NameMap(), ()
    h = h.replace(family="hsa-heldout" if is_heldout_harness(h, harness) else "hsa-train")
    h = h.replace(version=f"{harness.version}+hsa.{_digest(h)}")
    check_harness(h)
    return h, name_map, tuple(applied)
