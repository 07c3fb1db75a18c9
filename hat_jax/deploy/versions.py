"""The two versions a deployment switches separately: the policy (weights) and the harness.

Variant implemented and why: the HAT report releases policy and harness independently, so every
replay and gate report records both, each with where it came from.
- policy: `policy_version` of `HF_DIR/hat_export.json` (written by `export/to_hf.py`) when the
  exported folder is given, else the model id the server was asked for (`source` says which);
- harness: the manifest's `name` and `version` plus `sha256`, a hash of the whole harness content
  (the manifest as `harness_manifest` writes it and every `SKILL.md`, as canonical JSON), so an
  edit that forgot to bump `version` still shows as a different harness.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hat_jax.harness.state import HarnessState
from hat_jax.harness.writer import harness_manifest, skill_markdown

EXPORT_INFO = "hat_export.json"


def harness_version(harness: HarnessState) -> dict[str, str]:
    """{"name", "version", "sha256"} of `harness` (sha256: 64 hex digits over its full content)."""
    content = {"manifest": harness_manifest(harness), "skills": {s.name: skill_markdown(s) for s in harness.skills}}
    blob = json.dumps(content, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return {"name": harness.name, "version": harness.version, "sha256": hashlib.sha256(blob.encode()).hexdigest()}


def policy_version(model: str, hf_dir: str | Path | None = None) -> dict[str, Any]:
    """{"version", "source", ...} of the served policy.

    Args:
      model: the served model id (used when `hf_dir` is None).
      hf_dir: the exported HF folder; its `hat_export.json` must hold a non-empty string
        `policy_version` (other fields of the file are copied under "export").
    Raises:
      FileNotFoundError: `hf_dir` has no `hat_export.json`.
      ValueError: the file is not a JSON object or `policy_version` is missing or not a non-empty string.
    """
    if hf_dir is None:
        return {"version": model, "source": "served model id"}
    path = Path(hf_dir) / EXPORT_INFO
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found (export the checkpoint with export/to_hf.py, or omit --hf-dir)")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(info, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(info).__name__}")
    version = info.get("policy_version")
    if not isinstance(version, str) or not version:
        raise ValueError(f"{path}: field 'policy_version' must be a non-empty string, got {version!r}")
    return {"version": version, "source": str(path), "export": {k: v for k, v in info.items() if k != "policy_version"}}
