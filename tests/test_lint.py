"""The package's import layers (`[importlinter]` in setup.cfg: each layer imports only from those below it)
and pyflakes' checks (ruff's F rules: undefined names, unused imports, ...) over the code and the tests."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(path).exists():
        pytest.skip(f"{name} missing: pip install -e '.[test]'")
    return path


def test_import_layers_contract_is_kept():
    proc = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_ruff_pyflakes_checks_pass():
    proc = subprocess.run([_tool("ruff"), "check", "--select", "F", "--output-format", "concise", "hat_jax", "tests",
                           "configs", "experiments", "export"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
