"""Writes a `HarnessState` as a harness folder (`harness.yaml` + `skills/<name>/SKILL.md`), the layout
`hat_jax.harness.loader` reads: `load_harness(dump_harness(h, d), bindings) == h` for every `h` in normal form.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hat_jax.harness.loader import BINDING_KEY, MANIFEST, SKILL_FILE, SKILL_KEY_FIELD
from hat_jax.harness.state import HOOK_EVENTS, HarnessState, Skill


def _plain(value: Any) -> Any:
    """Mappings -> dicts, tuples -> lists, recursively (what yaml.safe_dump writes)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def harness_manifest(h: HarnessState) -> dict:
    """The `harness.yaml` content of `h` as plain data (skills as folder names)."""
    sections = []
    for s in h.sections:
        sec: dict[str, Any] = {"key": s.key, "title": s.title, "text": s.text}
        if s.constraints:
            sec["constraints"] = [
                {"id": c.id, "kwargs": _plain(c.kwargs)} if c.kwargs else {"id": c.id} for c in s.constraints
            ]
        sections.append(sec)
    hooks: dict[str, list] = {}
    for spec in h.hooks:
        entry: dict[str, Any] = {"handler": spec.handler}
        if spec.matcher is not None:
            entry["matcher"] = spec.matcher
        entry["params"] = _plain(spec.params)
        hooks.setdefault(spec.event, []).append(entry)
    tools = [
        {
            **_plain(t.mcp_spec()),
            BINDING_KEY: {"impl": t.impl, "arg_paths": {k: list(v) for k, v in t.arg_paths.items()}},
        }
        for t in h.tools
    ]
    return {
        "name": h.name,
        "version": h.version,
        "family": h.family,
        "heading_style": h.heading_style,
        **({"skill_listing": h.skill_listing} if h.skill_listing != "name_first" else {}),
        "skill_tool": h.skill_tool,
        "skills": [s.name for s in h.skills],
        "prompt": sections,
        "tools": tools,
        "hooks": {e: hooks[e] for e in HOOK_EVENTS if e in hooks},
    }


def skill_markdown(skill: Skill) -> str:
    """The `SKILL.md` text of `skill` (front matter + body)."""
    meta: dict[str, Any] = {"name": skill.name, "description": skill.description}
    if skill.allowed_tools:
        meta["allowed-tools"] = " ".join(skill.allowed_tools)
    if skill.key:
        meta["metadata"] = {SKILL_KEY_FIELD: skill.key}
    front = yaml.safe_dump(meta, allow_unicode=True, sort_keys=False, width=1000)
    return f"---\n{front}---\n{skill.body.strip(chr(10))}\n"


def dump_harness(h: HarnessState, out_dir: str | Path) -> Path:
    """Writes `h` as a harness folder (`harness.yaml` + `skills/<name>/SKILL.md`).

    Args:
      h: the harness (in normal form for an exact round trip, see the module docstring).
      out_dir: the folder to write (created if missing; files of other skills already there stay).
    Returns:
      the path of the written `harness.yaml`.
    """
    out = Path(out_dir)
    (out / "skills").mkdir(parents=True, exist_ok=True)
    manifest = out / MANIFEST
    manifest.write_text(
        yaml.safe_dump(harness_manifest(h), allow_unicode=True, sort_keys=False, width=1000), encoding="utf-8"
    )
    for skill in h.skills:
        (out / "skills" / skill.name).mkdir(exist_ok=True)
        (out / "skills" / skill.name / SKILL_FILE).write_text(skill_markdown(skill), encoding="utf-8")
    return manifest
