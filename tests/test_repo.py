"""Repository invariants: CI runs exactly the README's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    commands = [b.strip() for b in blocks if "pytest" in b]
    assert len(commands) == 1, f"expected one bash block with the test command, found {commands}"
    return commands[0]


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert readme_test_command() in ci_lines
