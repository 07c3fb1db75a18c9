"""The registry of HSA transforms: each transform registers itself, with its held-out behaviour and parameters.

`@hsa_transform(heldout=...)` registers a function `(h, rng, *, ...) -> (HarnessState, NameMap)` under its
name; its keyword-only arguments (other than `heldout`) are the parameters `HSAConfig.params` may set, their
defaults what `compose` passes otherwise. The transforms themselves live in `hat_jax.harness.hsa_transforms`,
which fills `HSA_TRANSFORMS` when imported (`hat_jax.harness.hsa` imports it).
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Callable, Mapping
from typing import Any

from hat_jax.harness.hsa_rewrite import NameMap
from hat_jax.harness.state import HarnessState

HELDOUT_MODES: tuple[str, ...] = ("forced", "family", "none")


@dataclasses.dataclass(frozen=True)
class HSATransform:
    """One registered HSA transform.

    Attributes:
      name: the registry key (the function's name).
      fn: `fn(harness, rng, *, [heldout: bool,] **params) -> (HarnessState, NameMap)`.
      heldout: "forced" (takes `heldout`; always applied, in its held-out family, on the held-out split),
        "family" (takes `heldout`; draws its held-out family on the held-out split when it is drawn),
        "none" (no held-out family: the same on both splits).
      params: the keyword parameters `HSAConfig.params[name]` may set, with their defaults.
      check: params -> None, raising ValueError on a bad value (None: no check beyond the default's type).
    """

    name: str
    fn: Callable[..., tuple[HarnessState, NameMap]]
    heldout: str
    params: Mapping[str, Any]
    check: Callable[[Mapping[str, Any]], None] | None = None

    def apply(self, h: HarnessState, rng: random.Random, params: Mapping[str, Any], heldout: bool):
        """`fn(h, rng, **params)`, plus `heldout=` unless the transform has no held-out family."""
        kwargs = dict(params) if self.heldout == "none" else {**params, "heldout": heldout}
        return self.fn(h, rng, **kwargs)

    def check_params(self, params: Mapping[str, Any], where: str) -> dict[str, Any]:
        """`params` with lists made tuples, checked against `self.params` and `self.check`.

        Raises:
          ValueError: an unknown parameter or a value of another type than its default (names `where` and
            the key), or what `check` raises.
        """
        out = {}
        for key, value in params.items():
            if key not in self.params:
                raise ValueError(f"{where}: {self.name} has no parameter {key!r}; it takes "
                                 f"{', '.join(self.params) or 'none'}")
            value = tuple(value) if isinstance(value, list) else value
            default = self.params[key]
            kind = float if isinstance(default, float) else type(default)
            if default is not None and not (isinstance(value, kind) or kind is float and type(value) is int):
                raise ValueError(f"{where}[{key!r}] = {value!r}: expected a {kind.__name__} like the default "
                                 f"{default!r}")
            out[key] = value
        if self.check is not None:
            try:
                self.check({**self.params, **out})
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
        return out


HSA_TRANSFORMS: dict[str, HSATransform] = {}


def transform_names() -> tuple[str, ...]:
    """The registered transforms, in registration order (the order `compose` applies them in)."""
    return tuple(HSA_TRANSFORMS)


def heldout_forced() -> frozenset[str]:
    """The transforms always applied on the held-out split (`heldout="forced"`)."""
    return frozenset(n for n, t in HSA_TRANSFORMS.items() if t.heldout == "forced")


def hsa_transform(*, heldout: str | None = None, check: Callable[[Mapping[str, Any]], None] | None = None):
    """Registers the decorated function as an HSA transform named after it (see `HSATransform`).

    The function takes `(h, rng)` positionally and everything else keyword-only with a default; it takes
    `heldout` exactly when `heldout` is "forced" or "family".

    Raises:
      ValueError (at import, naming the transform and the key): a name already registered, `heldout`
        missing or not one of `HELDOUT_MODES`, a signature that does not fit it, a parameter without a default.
    """

    def register(fn):
        name = fn.__name__
        if name in HSA_TRANSFORMS:
            raise ValueError(f"HSA transform {name!r}: already registered")
        if heldout not in HELDOUT_MODES:
            raise ValueError(f"HSA transform {name!r}: heldout = {heldout!r}; expected one of "
                             f"{', '.join(HELDOUT_MODES)}")
        sig = list(inspect.signature(fn).parameters.values())
        if len(sig) < 2 or any(p.kind != p.POSITIONAL_OR_KEYWORD for p in sig[:2]):
            raise ValueError(f"HSA transform {name!r}: expected (h, rng, *, ...) as its parameters")
        params = {}
        for p in sig[2:]:
            if p.kind != p.KEYWORD_ONLY or p.default is p.empty:
                raise ValueError(f"HSA transform {name!r}: parameter {p.name!r} must be keyword-only with a default")
            params[p.name] = p.default
        if ("heldout" in params) != (heldout != "none"):
            raise ValueError(f"HSA transform {name!r}: heldout = {heldout!r} "
                             + ("takes no 'heldout' parameter" if heldout == "none" else "needs a 'heldout' parameter"))
        params.pop("heldout", None)
        HSA_TRANSFORMS[name] = HSATransform(name, fn, heldout, params, check)
        return fn

    return register


def check_count(*fields: str) -> Callable[[Mapping[str, Any]], None]:
    """A `check` that each of `fields` is an inclusive (min, max) count with 0 <= min <= max."""

    def check(params: Mapping[str, Any]) -> None:
        for field in fields:
            lo, hi = params[field]
            if not 0 <= lo <= hi:
                raise ValueError(f"{field} = {(lo, hi)}: expected 0 <= min <= max")
    return check


def check_probability(*fields: str) -> Callable[[Mapping[str, Any]], None]:
    """A `check` that each of `fields` is a probability in [0, 1]."""

    def check(params: Mapping[str, Any]) -> None:
        for field in fields:
            if not 0.0 <= params[field] <= 1.0:
                raise ValueError(f"{field} = {params[field]}: expected a probability in [0, 1]")
    return check
