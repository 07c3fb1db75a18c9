"""Model configuration: a frozen mirror of transformers' `Qwen3_5MoeTextConfig`, plus presets.

Field names are the Hugging Face ones (transformers 5.23, `configuration_qwen3_5_moe.py`), so the mapping
to and from a checkpoint's `config.json` is the identity for every field we model. Keys of a source
`config.json` that we do not model are kept in `extra` and written back on export.

Presets:
- `micro`: unit tests, seconds on CPU; 4 layers (3 Gated DeltaNet + 1 gated attention), 8 experts top-2,
  one MTP layer.
- `tiny`: the CPU default for experiments (~4M parameters, ~1.6M active per token).
- `qwen3_6_35b_a3b`: the real Qwen3.5/3.6-35B-A3B text model (its released config.json).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from typing import Any, Mapping

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


@dataclasses.dataclass(frozen=True)
class RopeParameters:
    """`rope_parameters` of the HF config. Text positions use plain 1-D RoPE: with identical (T, H, W)
    position rows, interleaved mRoPE reduces exactly to 1-D RoPE (transformers'
    `Qwen3_5MoeTextRotaryEmbedding`), so `mrope_*` are carried only for export."""

    rope_type: str = "default"
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    mrope_interleaved: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mrope_section"] = list(self.mrope_section)
        return d


@dataclasses.dataclass(frozen=True)
class Qwen3_5MoeTextConfig:
    """The `qwen3_5_moe_text` architecture. Defaults are the 35B-A3B values, as in transformers."""

    vocab_size: int = 248320
    hidden_size: int = 2048
    num_hidden_layers: int = 40
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 256
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    attention_dropout: float = 0.0
    tie_word_embeddings: bool = False
    attn_output_gate: bool = True
    # Gated DeltaNet ("linear attention") layers.
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    mamba_ssm_dtype: str = "float32"
    # Sparse MoE in every layer.
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    num_experts: int = 256
    num_experts_per_tok: int = 8
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False
    # Layer pattern; empty means "derive from full_attention_interval" as transformers' __post_init__ does.
    layer_types: tuple[str, ...] = ()
    full_attention_interval: int = 4
    rope_parameters: RopeParameters = RopeParameters()
    max_position_embeddings: int = 262144
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = 248044   # a list in config.json becomes a tuple
    # Multi-token prediction (vLLM `Qwen3_5MoeMTP`; transformers ignores `mtp.*`).
    mtp_num_hidden_layers: int = 1
    mtp_use_dedicated_embeddings: bool = False
    # Keys of a source config.json that we carry through unchanged (sorted (key, json) pairs).
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        for name in ("full_attention_interval", "num_hidden_layers"):  # layer_types is built from them
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config field {name}: expected a positive integer, got {value!r}")
        if not self.layer_types:
            types = tuple(
                LINEAR_ATTENTION if (i + 1) % self.full_attention_interval else FULL_ATTENTION
                for i in range(self.num_hidden_layers)
            )
            object.__setattr__(self, "layer_types", types)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if isinstance(self.rope_parameters, Mapping):
            object.__setattr__(self, "rope_parameters", _rope_from_dict(self.rope_parameters))
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the inconsistent field."""
        for name in _POSITIVE_INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config field {name}: expected a positive integer, got {value!r}")
        for name in ("pad_token_id", "bos_token_id"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 0 <= value < self.vocab_size):
                raise ValueError(f"config field {name}: expected None or an id in [0, vocab_size={self.vocab_size}), "
                                 f"got {value!r}")
        for value in self.eos_token_ids:
            if not (isinstance(value, int) and 0 <= value < self.vocab_size):
                raise ValueError(f"config field eos_token_id: expected ids in [0, vocab_size={self.vocab_size}), "
                                 f"got {self.eos_token_id!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries, expected num_hidden_layers="
                f"{self.num_hidden_layers}"
            )
        for t in self.layer_types:
            if t not in (LINEAR_ATTENTION, FULL_ATTENTION):
                raise ValueError(f"layer_types entry {t!r}: expected {LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}")
        checks = [
            ("num_attention_heads", self.num_attention_heads % self.num_key_value_heads == 0,
             "a multiple of num_key_value_heads"),
            ("linear_num_value_heads", self.linear_num_value_heads % self.linear_num_key_heads == 0,
             "a multiple of linear_num_key_heads"),
            ("num_experts_per_tok", 0 < self.num_experts_per_tok <= self.num_experts, "in [1, num_experts]"),
            ("hidden_act", self.hidden_act == "silu", "'silu' (the only activation of this architecture)"),
            ("rope_parameters.rope_type", self.rope_parameters.rope_type == "default", "'default'"),
            ("rotary_dim", self.rotary_dim % 2 == 0 and self.rotary_dim > 0,
             "head_dim * partial_rotary_factor to be a positive even integer"),
            ("rope_parameters.mrope_section", sum(self.rope_parameters.mrope_section) == self.rotary_dim // 2,
             f"entries summing to rotary_dim / 2 = {self.rotary_dim // 2} (head_dim * partial_rotary_factor / 2)"),
            ("mtp_num_hidden_layers", self.mtp_num_hidden_layers in (0, 1), "0 or 1"),
            ("mtp_use_dedicated_embeddings", not self.mtp_use_dedicated_embeddings, "false"),
            ("attention_bias", not self.attention_bias, "false"),
            ("tie_word_embeddings", not self.tie_word_embeddings, "false (this architecture has an untied lm_head)"),
            ("attn_output_gate", self.attn_output_gate, "true"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"config field {name}: expected {expected}, got {getattr(self, name, None)!r}")

    # Derived sizes -----------------------------------------------------------------------------------
    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """`eos_token_id` as a tuple (empty when unset)."""
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope_parameters.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    def replace(self, **changes) -> "Qwen3_5MoeTextConfig":
        """Returns a copy with `changes`; unknown field names raise ValueError listing the valid ones."""
        _check_fields(changes)
        if "num_hidden_layers" in changes and "layer_types" not in changes:
            changes["layer_types"] = ()
        return dataclasses.replace(self, **changes)

    # Hugging Face config.json ------------------------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """The `text_config` dict of a `config.json` (model_type `qwen3_5_moe_text`)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d["layer_types"] = list(self.layer_types)
        d["rope_parameters"] = self.rope_parameters.to_dict()
        if isinstance(self.eos_token_id, tuple):
            d["eos_token_id"] = list(self.eos_token_id)
        d["model_type"] = "qwen3_5_moe_text"
        for key, value in self.extra:
            d.setdefault(key, json.loads(value))
        return d

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "Qwen3_5MoeTextConfig":
        """Builds a config from a `config.json` dict: either a text config or a VL wrapper holding
        `text_config`. Unknown keys are kept in `extra`. Raises ValueError on a wrong `model_type`."""
        if "text_config" in d:
            d = d["text_config"]
        model_type = d.get("model_type", "qwen3_5_moe_text")
        if model_type not in ("qwen3_5_moe_text", "qwen3_5_moe"):
            raise ValueError(f"config model_type {model_type!r}: expected 'qwen3_5_moe_text' or 'qwen3_5_moe'")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names and k != "model_type"}
        if "rope_parameters" not in kwargs and "rope_theta" in d:  # older flat layout
            kwargs["rope_parameters"] = {
                "rope_theta": d["rope_theta"], "partial_rotary_factor": d.get("partial_rotary_factor", 0.25)}
            extra.pop("rope_theta", None)
            extra.pop("partial_rotary_factor", None)
        if "rope_parameters" in kwargs:
            kwargs["rope_parameters"] = _rope_from_dict(kwargs["rope_parameters"])
        if "layer_types" in kwargs:
            kwargs["layer_types"] = tuple(kwargs["layer_types"] or ())
        kwargs["extra"] = tuple(sorted((k, json.dumps(v)) for k, v in extra.items()))
        return cls(**kwargs)


_POSITIVE_INT_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
    "linear_num_value_heads", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
    "num_experts_per_tok", "max_position_embeddings",
)


def _rope_from_dict(d: Mapping[str, Any]) -> RopeParameters:
    valid = {f.name for f in dataclasses.fields(RopeParameters)}
    unknown = set(d) - valid
    if unknown:
        raise ValueError(f"rope_parameters: unknown keys {sorted(unknown)}; valid keys are {sorted(valid)}")
    d = dict(d)
    if "mrope_section" in d:
        d["mrope_section"] = tuple(d["mrope_section"])
    return RopeParameters(**d)


def _check_fields(changes: Mapping[str, Any]) -> None:
    valid = [f.name for f in dataclasses.fields(Qwen3_5MoeTextConfig)]
    for key in changes:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=3)
            hint = f" Did you mean {close}?" if close else ""
            raise ValueError(f"unknown config field {key!r}.{hint} Valid fields: {', '.join(valid)}")


_MICRO = dict(
    vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, max_position_embeddings=4096, eos_token_id=2, pad_token_id=0,
    rope_parameters=RopeParameters(mrope_section=(2, 1, 1)),
)

_TINY = dict(
    vocab_size=4096, hidden_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
    shared_expert_intermediate_size=128, max_position_embeddings=8192, eos_token_id=2, pad_token_id=0,
    rope_parameters=RopeParameters(rope_theta=1_000_000.0, mrope_section=(2, 1, 1)),
)

PRESETS: dict[str, dict[str, Any]] = {
    "micro": _MICRO,
    "tiny": _TINY,
    "qwen3_6_35b_a3b": {},  # the class defaults are the real values
}


def get_config(preset: str, **overrides) -> Qwen3_5MoeTextConfig:
    """Returns the named preset with optional field overrides.

    Raises:
        ValueError: unknown preset (the message lists the valid ones) or unknown field.
    """
    if preset not in PRESETS:
        close = difflib.get_close_matches(preset, PRESETS, n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"unknown preset {preset!r}.{hint} Valid presets: {', '.join(PRESETS)}")
    _check_fields(overrides)
    return Qwen3_5MoeTextConfig(**{**PRESETS[preset], **overrides})
