"""Experiment scales: every config an experiment chain uses, at one model scale, and `--set` overrides of them.

A scale is one file in `configs/` (`micro`, `tiny`, `qwen3_6_35b_a3b`) whose `get_config()` returns a `Scale`:
the base (pretrained from scratch at micro/tiny scale by `hat_jax.train.pretrain`; imported from a local
Hugging Face folder at real scale), the SFT / general-OPD / RL / live-OPD stage configs, the strong teacher of
Table 5's distillation arm and the evaluation config. `experiments/run.py --preset NAME` and the stage CLIs
(`python -m hat_jax.train.sft --preset NAME`, which run their section) read the same file. `--set
section.field=value` overrides any field (sections: `SECTIONS`), and `--set world.harness=NAME` the harness of every
section's world (`with_world_harness`); a stage's schedule ends at its steps unless its `optim.total_steps` is set
(`hat_jax.train.optim.OptimConfig`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hat_jax.experiments.stage_kinds import CHAIN_FIELDS, STAGE_KINDS, load_attr
from hat_jax.train.stage import apply_overrides, config_json, config_names, did_you_mean, load_config

if TYPE_CHECKING:
    from hat_jax.eval import EvalConfig
    from hat_jax.train.opd_config import OPDConfig
    from hat_jax.train.pretrain import PretrainConfig
    from hat_jax.train.rl import RLConfig
    from hat_jax.train.sft import SFTConfig

SCALES: tuple[str, ...] = config_names()
SECTIONS: tuple[str, ...] = ("base", *STAGE_KINDS, "teacher", "eval")


def _section_types() -> dict[str, type]:
    from hat_jax.eval import EvalConfig

    return {**{name: load_attr(kind.config) for name, kind in STAGE_KINDS.items()}, "eval": EvalConfig}


def _check_type(owner: str, name: str, value: Any, kind: type, optional: bool = False) -> None:
    if not (isinstance(value, kind) or (optional and value is None)):
        raise ValueError(f"{owner}.{name}: expected a {kind.__name__}{' or None' if optional else ''}, "
                        f"got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class BaseSpec:
    """Where the base comes from: `pretrain` (trained and cached) or `hf_path` (imported).

    Raises ValueError: pretrain is not a PretrainConfig (or None)."""

    pretrain: PretrainConfig | None = None
    hf_path: str | None = None

    def __post_init__(self):
        from hat_jax.train.pretrain import PretrainConfig

        _check_type("BaseSpec", "pretrain", self.pretrain, PretrainConfig, optional=True)


@dataclasses.dataclass(frozen=True)
class TeacherSpec:
    """Table 5's strong teacher: an existing checkpoint (`path`) or one trained by HSA-SFT (`sft`, cached).

    Raises ValueError: sft is not an SFTConfig (or None)."""

    sft: SFTConfig | None = None
    path: str | None = None

    def __post_init__(self):
        from hat_jax.train.sft import SFTConfig

        _check_type("TeacherSpec", "sft", self.sft, SFTConfig, optional=True)


@dataclasses.dataclass(frozen=True)
class Scale:
    """All configs of one scale (module docstring). Stage configs carry no init/teacher/seed yet: the chain
    runner (`hat_jax.experiments.chain`) sets those.

    Raises ValueError: a section of another type than its annotation (names it); sections whose worlds name
    different harnesses (lists them)."""

    name: str
    base: BaseSpec
    sft: SFTConfig
    opd: OPDConfig
    rl: RLConfig
    opd_live: OPDConfig
    teacher: TeacherSpec
    eval: EvalConfig

    def __post_init__(self):
        _check_type("Scale", "base", self.base, BaseSpec)
        _check_type("Scale", "teacher", self.teacher, TeacherSpec)
        for name, kind in _section_types().items():
            _check_type("Scale", name, getattr(self, name), kind)
        harnesses = self.world_harnesses()
        if len(set(harnesses.values())) > 1:
            listed = ", ".join(f"{k}: {v}" for k, v in harnesses.items())
            raise ValueError(f"Scale {self.name!r}: the sections' worlds name different harnesses ({listed}); the data, "
                             f"training and evaluation of a scale share one world harness: set it for every section "
                             f"with --set world.harness=NAME (`with_world_harness`)")

    def world_harnesses(self) -> dict[str, str]:
        """{section: its world's harness} for every section that has a world (a base or teacher that is imported
        has none)."""
        sections = {"base": self.base.pretrain, **{k: getattr(self, k) for k in STAGE_KINDS}, "teacher": self.teacher.sft,
                    "eval": self.eval}
        return {k: v.world.harness for k, v in sections.items() if v is not None and hasattr(v, "world")}

    def to_json(self) -> dict:
        """Every section as `config_json` writes it (stage schedules resolved)."""
        return {f.name: _section_json(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _section_json(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (BaseSpec, TeacherSpec)):
        return {f.name: _section_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return config_json(value)


def get_scale(name: str) -> Scale:
    """The scale of `configs/<name>.py` (or of a config file's path, FILE.py).

    Raises:
      ValueError: an unknown name (lists the valid ones, with close matches), a file whose get_config() does not
        return a Scale (names the file).
    """
    scale = load_config(name)
    if not isinstance(scale, Scale):
        raise ValueError(f"scale config {name!r}: get_config() returned a {type(scale).__name__}, expected a "
                         "hat_jax.experiments.scales.Scale")
    return scale


def apply_scale_overrides(scale: Scale, assignments: Sequence[str]) -> Scale:
    """`section.field[.sub]=value` assignments (JSON values, else strings) applied to `scale`.

    `base.hf_path=P` and `teacher.path=P` set where the real-scale base and teacher come from; `base.<field>`
    otherwise overrides the pretraining config, `teacher.<field>` the teacher's SFT config. `X.steps=N` also
    moves the end of X's schedule unless X.optim.total_steps is set.

    Raises:
      ValueError: a malformed assignment, an unknown section (lists `SECTIONS`) or field (lists the valid ones),
        a section without a field, a field the chain sets (`StageKind.chain_fields`, with who sets it), a value
        of the wrong type or out of its range (a stage's steps below 1); the SFT model no longer the base's
        (`check_base_model`, after every assignment is applied).
    """
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected section.field=value")
        key, value = item.split("=", 1)
        section, _, rest = key.strip().partition(".")
        if section == "world":
            if rest != "harness":
                raise ValueError(f"--set {item!r}: the world section takes only harness (world.harness=NAME sets the "
                                 f"harness of every section's world); set other world fields per section, e.g. "
                                 f"eval.world.eval_items=200")
            try:
                scale = with_world_harness(scale, value)
            except ValueError as err:
                raise ValueError(f"--set {item!r}: {err}") from None
            continue
        if section in SECTIONS and not rest:
            raise ValueError(f"--set {item!r}: {section!r} is a section; name a field of it, as "
                             f"{section}.field=value (e.g. {section}.steps=6)")
        if section in STAGE_KINDS and rest in STAGE_KINDS[section].chain_fields:
            raise ValueError(f"--set {item!r}: {section}.{rest} is set by the experiment chain: {CHAIN_FIELDS[rest]}")
        if section not in SECTIONS:
            raise ValueError(f"--set {item!r}: unknown section {section!r}{did_you_mean(section, SECTIONS)}; "
                             f"valid sections: {', '.join(SECTIONS)}, as section.field=value (and world.harness=NAME)")
        if section == "base" and rest == "hf_path":
            scale = dataclasses.replace(scale, base=BaseSpec(pretrain=None, hf_path=value))
            continue
        if section == "teacher" and rest == "path":
            scale = dataclasses.replace(scale, teacher=TeacherSpec(sft=None, path=value))
            continue
        target = {"base": scale.base.pretrain, "teacher": scale.teacher.sft}.get(section, getattr(scale, section))
        if target is None:
            raise ValueError(f"--set {item!r}: preset {scale.name!r} has no {section} config to override "
                             f"(its {section} is {'imported' if section == 'base' else 'a given checkpoint'})")
        try:
            updated = apply_overrides(target, [f"{rest}={value}"])
        except ValueError as err:
            raise ValueError(f"--set {item!r}: {err}".replace(f"--set {rest}:", f"{section}.{rest}:")) from None
        if section == "base":
            scale = dataclasses.replace(scale, base=BaseSpec(pretrain=updated))
        elif section == "teacher":
            scale = dataclasses.replace(scale, teacher=TeacherSpec(sft=updated))
        else:
            scale = dataclasses.replace(scale, **{section: updated})
    check_base_model(scale)
    return scale


def check_base_model(scale: Scale) -> None:
    """Raises ValueError, listing the fields that differ, when the scale pretrains its base and the SFT config's
    model (preset + model_overrides) is not the base's: HSA-SFT starts from the base's checkpoint, which would
    be refused only when the stage loads it."""
    pretrain = scale.base.pretrain
    if pretrain is None:
        return
    sft_model, base_model = scale.sft.model_config(), pretrain.model_config()
    if sft_model == base_model:
        return
    mine, theirs = dataclasses.asdict(sft_model), dataclasses.asdict(base_model)
    diff = ", ".join(f"{k}: {mine[k]!r} vs {theirs.get(k)!r}" for k in mine if mine[k] != theirs.get(k))
    raise ValueError(f"Scale {scale.name!r}: sft.preset/model_overrides give another model than the base's ({diff}; "
                     f"sft vs base); HSA-SFT starts from the base, so both need the same model: set the field in both "
                     f"sections (--set base.model.FIELD=VALUE --set sft.model.FIELD=VALUE)")


def with_world_harness(scale: Scale, harness: str) -> Scale:
    """`scale` with `harness` as the world harness (`WorldDataConfig.harness`) of every section that has a world: the
    base (its tokenizer's key), the stages, the teacher and the evaluation.

    Raises:
      ValueError: no such harness, or one that fails validation (`WorldDataConfig`).
    """
    def swap(config):
        if config is None or not hasattr(config, "world"):
            return config
        return dataclasses.replace(config, world=dataclasses.replace(config.world, harness=harness))

    changes = {name: swap(getattr(scale, name)) for name in (*STAGE_KINDS, "eval")}
    base, teacher = scale.base, scale.teacher
    if base.pretrain is not None:
        base = dataclasses.replace(base, pretrain=swap(base.pretrain))
    if teacher.sft is not None:
        teacher = dataclasses.replace(teacher, sft=swap(teacher.sft))
    return dataclasses.replace(scale, base=base, teacher=teacher, **changes)


def describe(scale: Scale, kinds: Sequence[str] | None = None) -> Mapping[str, Any]:
    """A short summary of the budget for logs and results.json: the base, the steps of each stage kind in
    `kinds` (every kind of `STAGE_KINDS` when None) and the eval items per suite."""
    base = scale.base.pretrain
    out: dict[str, Any] = {"base": ("hf:" + str(scale.base.hf_path)) if base is None else f"pretrain {base.steps} steps"}
    for kind in STAGE_KINDS:
        if kinds is None or kind in kinds:
            out[f"{kind}_steps"] = getattr(scale, kind).steps
    out["eval_items"] = scale.eval.world.eval_items
    return out
