"""The kinds of training stage a chain is made of: one table read by the declarations, the scales and the runner.

A stage of a row's chain is `kind:variant` (`hat_jax.experiments.declarations`), optionally with overrides of
its config. Each `StageKind` says everything the experiment code needs about it: the `Scale` section holding
its config (the kind's name), the config class and the run function, its variants and the fields each sets,
the fields the chain sets itself (init, seeds, teacher, reference) and the checkpoint it distils from. Adding a
kind is a row here, a field of `hat_jax.experiments.scales.Scale` and a section in each `configs/` file.

Classes and functions are named as "module:attribute" and imported when used, so reading a declaration file
needs no JAX.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# What a --set or a row override of a chain-set field would be overwritten by, and how to choose it instead.
CHAIN_FIELDS: dict[str, str] = {
    "init": "each stage starts from the previous stage's checkpoint, the first from the base; choose the chain "
            "with --exp and the base with --set base.*",
    "seed": "every stage's seed is the experiment's seed; choose it with --seeds",
    "data.seed": "SFT's data seed is the experiment's seed; choose it with --seeds",
    "ref": "the KL reference is the stage's starting checkpoint; choose the chain with --exp",
    "teacher": "general OPD distils from the base, live OPD from Table 5's strong teacher; give that one with "
               "--set teacher.path=DIR",
    "harness_mode": "the harness (original or hsa) is the stage's variant in the row's declaration; choose the "
                    "row with --exp",
    "data.p_hsa": "sft:original trains on the original harness only (p_hsa 0); use sft:hsa to set the mixing "
                  "probability",
}


def _hsa_switch(config, variant: str):
    from hat_jax.train.sft import with_hsa

    return with_hsa(config, variant == "hsa")


def _harness_mode(config, variant: str):
    return dataclasses.replace(config, harness_mode=variant)


def _unchanged(config, variant: str):
    return config


@dataclasses.dataclass(frozen=True)
class StageKind:
    """One kind of stage.

    Attributes:
      name: the kind in a chain ("sft") and the `Scale` section holding its config.
      config: "module:Class" of its config dataclass. run: "module:function" of its run function, called as
        run(config, out_dir, resume=True, progress=...).
      variants: variant -> the config fields the variant sets (`with_variant`).
      with_variant: (config, variant) -> the config of that variant.
      seed_fields: the fields set to the experiment's seed.
      teacher: the checkpoint given as the config's `teacher`: None, "base" (the chain's base) or "strong" (the
        scale's Table 5 teacher; its key is part of the stage's key).
      fixed_fields: other fields the chain relies on staying as the scale has them (RL's `ref`: None, the init).
    """

    name: str
    config: str
    run: str
    variants: Mapping[str, tuple[str, ...]]
    with_variant: Callable[[Any, str], Any]
    seed_fields: tuple[str, ...] = ("seed",)
    teacher: str | None = None
    fixed_fields: tuple[str, ...] = ()

    @property
    def chain_fields(self) -> tuple[str, ...]:
        """The fields the chain sets on every stage of this kind (whatever the variant)."""
        teacher = ("teacher",) if self.teacher else ()
        first, *rest = self.variants.values()
        every = tuple(f for f in first if all(f in fields for fields in rest))
        return ("init", *self.seed_fields, *teacher, *self.fixed_fields, *every)

    def refused(self, variant: str) -> tuple[str, ...]:
        """The fields an override of a `kind:variant` stage may not set: the chain's and the variant's."""
        return tuple(dict.fromkeys(self.chain_fields + self.variants[variant]))


_HARNESS = {"original": ("harness_mode",), "hsa": ("harness_mode",)}
STAGE_KINDS: dict[str, StageKind] = {kind.name: kind for kind in (
    StageKind("sft", "hat_jax.train.sft:SFTConfig", "hat_jax.train.sft:run_sft",
              {"original": ("data.p_hsa",), "hsa": ()}, _hsa_switch, seed_fields=("seed", "data.seed")),
    StageKind("opd", "hat_jax.train.opd:OPDConfig", "hat_jax.train.opd:run_opd", {"general": ()}, _unchanged,
              teacher="base"),
    StageKind("rl", "hat_jax.train.rl:RLConfig", "hat_jax.train.rl:run_rl", _HARNESS, _harness_mode,
              fixed_fields=("ref",)),
    StageKind("opd_live", "hat_jax.train.opd:OPDConfig", "hat_jax.train.opd:run_opd", _HARNESS, _harness_mode,
              teacher="strong"),
)}


def load_attr(name: str) -> Any:
    """The attribute of "module:attribute"."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def assignments(overrides: Sequence[tuple[str, Any]]) -> list[str]:
    """(field path, value) pairs as `hat_jax.train.stage.apply_overrides` assignments (values as JSON)."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides]


def check_overrides(kind: StageKind, variant: str, overrides: Sequence[tuple[str, Any]]) -> None:
    """Checks a stage's overrides against its config class (defaults): each field exists, the value has its
    type and range, and no chain-set or variant-set field (`StageKind.refused`) or model field is set.

    Raises:
      ValueError: starting with the offending key: "<key>: <why>".
    """
    from hat_jax.train.stage import apply_overrides

    refused = kind.refused(variant)
    default = load_attr(kind.config)()
    for key, value in overrides:
        if key in refused:
            raise ValueError(f"{key}: set by the experiment chain for {kind.name}:{variant}: {CHAIN_FIELDS[key]}")
        if key.split(".")[0] == "model":
            raise ValueError(f"{key}: a stage's model is its init checkpoint's (the base's); set the scale's "
                             "model in its config file instead")
        try:
            apply_overrides(default, assignments([(key, value)]))
        except ValueError as err:
            raise ValueError(f"{key}: {str(err).removeprefix(f'--set {key}: ')}") from None
