"""Harness-State Augmentation (HSA): task-preserving transforms of a `HarnessState`.

Variant implemented and why: HSA as the HAT report, arXiv 2608.15763 (TaoLive, 2026), "The system",
defines it (task-preserving transforms of skill identifiers and content, tool schemas, prompt
structure and hooks). Each transform is a pure function `(harness, rng, ...) -> (harness', NameMap)`
that keeps the bindings to the world (`Tool.impl`, `Tool.arg_paths` meaning, `Skill.key`) and
changes only what the model reads; `hat_jax.harness.hsa_transforms` defines them (its docstring lists
them), each registered with its held-out behaviour and parameters (`hat_jax.harness.hsa_registry`).
`compose` applies them with per-transform probabilities and parameters from `HSAConfig`. Held-out
families (`hsa_vocab`: dotted/PascalCase tool names, reserved word combinations, the bracket heading
style with a persona-last order) are never drawn with split="train" and always with split="heldout".
`NameMap`, `rewrite_messages`, `behaviour_changed` and `check_harness` live in hsa_rewrite.py; this
module composes the transforms and re-exports the public API.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping
from typing import Any

from hat_jax.harness import hsa_transforms  # noqa: F401 - registers the transforms
from hat_jax.harness import hsa_vocab as V
from hat_jax.harness.hsa_registry import HSA_TRANSFORMS, HSATransform, heldout_forced, hsa_transform, transform_names
from hat_jax.harness.hsa_rewrite import HSAError, NameMap, behaviour_changed, check_harness, rewrite_messages
from hat_jax.harness.state import HarnessState

__all__ = [
    "HSA_TRANSFORMS",
    "HSATransform",
    "HSAConfig",
    "HSAError",
    "NameMap",
    "behaviour_changed",
    "check_harness",
    "compose",
    "heldout_forced",
    "hsa_transform",
    "is_heldout_harness",
    "rewrite_messages",
    "transform_names",
]


@dataclasses.dataclass(frozen=True)
class HSAConfig:
    """Which HSA transforms `compose` applies, and how.

    Attributes:
      probs: transform name -> probability of applying it (each drawn independently); names missing
        from the mapping get `default_p`.
      default_p: probability of a transform not in `probs`.
      allowed: the transforms that may be applied at all (others are never applied); default: every
        transform registered when the config is made.
      at_least_one: when no transform was drawn, apply one allowed transform chosen uniformly.
      params: transform name -> {parameter: value} passed to it, e.g. {"distractor_tools": {"count": (2, 4)}}
        (`HSATransform.params` lists each transform's parameters and defaults).
    """

    probs: Mapping[str, float] = dataclasses.field(default_factory=dict)
    default_p: float = 0.5
    allowed: tuple[str, ...] = dataclasses.field(default_factory=transform_names)
    at_least_one: bool = True
    params: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        names = transform_names()
        for name in (*self.probs, *self.allowed, *self.params):
            if name not in HSA_TRANSFORMS:
                raise ValueError(f"HSAConfig: unknown transform {name!r} (expected one of {names})")
        for name, p in self.probs.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"HSAConfig.probs[{name!r}] = {p}: expected a probability in [0, 1]")
        params = {n: HSA_TRANSFORMS[n].check_params(kw, f"HSAConfig.params[{n!r}]") for n, kw in self.params.items()}
        object.__setattr__(self, "params", params)

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
    """Applies a random subset of the registered HSA transforms, in registration order (`transform_names`).

    Args:
      harness: the harness to augment (usually the original one).
      rng: the draw's random source (the only randomness used).
      config: probabilities, allowed transforms, distractor counts.
      split: "train" (held-out families never drawn) or "heldout" (`heldout_forced()` transforms always
        applied, and every transform that has one in its held-out family).
      exclude: transforms not to apply in this draw (e.g. "hook_params" when no oracle can re-roll).
    Returns:
      (new harness, name map from `harness` to it, names of the transforms that changed something).
      The new harness has version f"{old}+hsa.{digest}"; with no change it is `harness` itself. Its
      family tells what it is, not what was asked for: "hsa-heldout" exactly when
      `is_heldout_harness(new, harness)` is True, else "hsa-train". With split="heldout" and a
      config whose `allowed` (minus `exclude`) lacks some of `heldout_forced()`, a draw may show no
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
    names, forced = transform_names(), heldout_forced()
    draws = {t: rng.random() < config.p(t) for t in names}
    chosen = [t for t in names if t in allowed and (draws[t] or (heldout and t in forced))]
    candidates = [t for t in allowed if config.p(t) > 0]
    if not chosen and config.at_least_one and candidates:
        chosen = [rng.choice(candidates)]
    h, name_map, applied = harness, NameMap(), []
    for name in names:
        if name in chosen:
            new, nm = HSA_TRANSFORMS[name].apply(h, rng, config.params.get(name, {}), heldout)
            if new != h:
                applied.append(name)
            h, name_map = new, name_map.then(nm)
    if not applied:
        return harness, NameMap(), ()
    h = h.replace(family="hsa-heldout" if is_heldout_harness(h, harness) else "hsa-train")
    h = h.replace(version=f"{harness.version}+hsa.{_digest(h)}")
    check_harness(h)
    return h, name_map, tuple(applied)
