"""Which steps of an Orbax `CheckpointManager` root are complete, decided from their files before any array is read.

A step `<root>/<N>/` is complete when Orbax's commit marker `_CHECKPOINT_METADATA` is present, is valid JSON
with a commit timestamp, and every item it lists (plus the items the caller requires) has its metadata
present and readable: `_METADATA` (valid JSON) and `manifest.ocdbt` for array items, `metadata` (valid JSON)
for JSON items. The latest complete step is the one to read; a newer step that is not complete is
*damaged* (an interrupted write on a file system without atomic renames, a deleted or truncated file) and is
reported, never skipped silently. Array data is not checked here (that needs reading it): a truncated array
file is found when the step is read, and reported with `DamagedCheckpointError` and the same recovery hint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

COMMIT_FILE = "_CHECKPOINT_METADATA"
DONE_FILE = "stage_done.json"   # an experiment's mark of a finished stage run dir (`hat_jax.experiments.chain`)
_ARRAY_FILES = ("_METADATA", "manifest.ocdbt")   # a StandardCheckpointHandler item (OCDBT)
_JSON_FILE = "metadata"                          # a JsonCheckpointHandler item

log = logging.getLogger("hat_jax.checkpoints")


class DamagedCheckpointError(ValueError):
    """A checkpoint step that cannot be read (missing, truncated or corrupt files); the message says which step,
    what failed and how to recover (`recovery_hint`)."""


@dataclasses.dataclass(frozen=True)
class StepScan:
    """The steps of a CheckpointManager root.

    root: the root (resolved). complete: complete steps, ascending. damaged: {step: what is wrong} for the step
    directories that are not complete.
    """

    root: Path
    complete: tuple[int, ...]
    damaged: dict[int, str]

    @property
    def latest(self) -> int | None:
        """The latest complete step, or None."""
        return self.complete[-1] if self.complete else None

    def newer_damaged(self) -> dict[int, str]:
        """The damaged steps newer than `latest` (all of them when there is no complete step)."""
        return {s: why for s, why in sorted(self.damaged.items()) if self.latest is None or s > self.latest}

    def warning(self) -> str | None:
        """The warning naming every damaged step newer than the one used and what to do; None when there is none."""
        newer = self.newer_damaged()
        if not newer:
            return None
        used = f"using step {self.latest}" if self.latest is not None else "no complete step is left"
        problems = "; ".join(f"step {s}: {why}" for s, why in newer.items())
        return (f"checkpoint {self.root}: newer step(s) {', '.join(map(str, newer))} incomplete or unreadable "
                f"({problems}); {used}. {recovery_hint(self.root, max(newer), self.latest)}")


def recovery_hint(root: Path, bad_step: int, fallback: int | None) -> str:
    """What a user does about damaged step `bad_step` of `root` when `fallback` (or None) is the step before it."""
    aside = f"mv {root / str(bad_step)} {root}.step{bad_step}.damaged"
    if (root / DONE_FILE).is_file():
        aside += f" && mv {root / DONE_FILE} {root}.{DONE_FILE}.old"   # the stage is not finished any more
    if fallback is not None:
        return (f"To resume from step {fallback}, move the damaged step out of the run dir ({aside}) and rerun "
                f"the same command (--resume for a stage's own CLI); nothing else is lost")
    return (f"No older complete step exists: restore {root / str(bad_step)} from a backup, or move it out of the "
            f"run dir ({aside}) and rerun to retrain the stage from its start")


def _is_closed_loop_callback(unraisable) -> bool:
    """True for the RuntimeError a TensorStore read raises when it completes after Orbax closed its event loop."""
    frames = []
    tb = unraisable.exc_traceback
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed"
            and "call_soon_threadsafe" in frames)


class _AbandonedReadErrors(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" record for a TensorStore read of an Orbax restore
    that had already failed on another array (the error is reported once, by the caller); other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        text = str(exc).lower() if exc is not None else ""
        return not (record.getMessage().startswith("Task exception was never retrieved")
                    and ("ocdbt" in text or "tensorstore" in text))


_ABANDONED_READ_ERRORS = _AbandonedReadErrors()


def silence_abandoned_reads() -> None:
    """Drops the late reports of the reads a failed Orbax restore abandoned; every other unraisable exception
    still reaches the previous `sys.unraisablehook`, and every other asyncio log record is still logged.

    When one array of a restore fails to read, Orbax (0.12.8, `asyncio_utils.run_sync`) closes its event loop
    while the other TensorStore reads are still in flight. Each of them then either fails to post its result
    (`call_soon_threadsafe` on a closed loop: an unraisable RuntimeError) or ends with its own read error that
    no one retrieves (asyncio logs "Task exception was never retrieved" when the task is collected). Python
    prints a traceback for each, after our error message; the results are discarded anyway, so they say
    nothing. Installed once per process, by the callers that turn a failed restore into
    `DamagedCheckpointError`, before they restore.
    """
    asyncio_log = logging.getLogger("asyncio")
    if _ABANDONED_READ_ERRORS not in asyncio_log.filters:
        asyncio_log.addFilter(_ABANDONED_READ_ERRORS)
    previous = sys.unraisablehook
    if getattr(previous, "_hat_jax_filter", False):
        return

    def hook(unraisable):
        if not _is_closed_loop_callback(unraisable):
            previous(unraisable)

    hook._hat_jax_filter = True
    sys.unraisablehook = hook


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, at most 300 characters ('(no message)' when empty)."""
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


def _json_problem(path: Path, name: str) -> str | None:
    if not path.is_file():
        return f"{name} is missing"
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{name} is unreadable ({type(err).__name__})"
    return None


def step_problem(step_dir: Path, required: Sequence[str] = ()) -> str | None:
    """None when `step_dir` is a complete step (module docstring), else what is wrong, e.g.
    'params/_METADATA is missing'. `required`: item names that must be present besides those the marker lists."""
    marker = step_dir / COMMIT_FILE
    problem = _json_problem(marker, COMMIT_FILE)
    if problem:
        return problem + " (the step was not committed)"
    data = json.loads(marker.read_text(encoding="utf-8"))
    handlers = data.get("item_handlers") if isinstance(data, dict) else None
    if not isinstance(handlers, dict) or not data.get("commit_timestamp_nsecs"):
        return f"{COMMIT_FILE} has no item list or commit time (the step was not committed)"
    for item in sorted(set(handlers) | set(required)):
        folder = step_dir / item
        if not folder.is_dir():
            return f"item {item}/ is missing"
        handler = str(handlers.get(item, ""))
        if "Json" in handler:
            problem = _json_problem(folder / _JSON_FILE, f"{item}/{_JSON_FILE}")
        else:
            problem = _json_problem(folder / _ARRAY_FILES[0], f"{item}/{_ARRAY_FILES[0]}")
            if problem is None and not (folder / _ARRAY_FILES[1]).is_file():
                problem = f"{item}/{_ARRAY_FILES[1]} is missing"
        if problem:
            return problem
    return None


def scan_steps(root: str | Path, required: Sequence[str] = ()) -> StepScan:
    """Every integer-named step directory of `root` sorted into complete and damaged (Orbax's temporary
    directories, whose names are not integers, are ignored). A missing root gives an empty scan."""
    root = Path(root).resolve()
    complete, damaged = [], {}
    if root.is_dir():
        for path in sorted((p for p in root.iterdir() if p.name.isdigit() and p.is_dir()), key=lambda p: int(p.name)):
            problem = step_problem(path, required)
            if problem is None:
                complete.append(int(path.name))
            else:
                damaged[int(path.name)] = problem
    return StepScan(root, tuple(complete), damaged)


def latest_complete_step(root: str | Path, required: Sequence[str] = (), *, warn: bool = True) -> int | None:
    """`scan_steps(root, required).latest`; logs `StepScan.warning` (when `warn`) so no damaged step is skipped
    silently."""
    scan = scan_steps(root, required)
    if warn and (message := scan.warning()):
        log.warning("%s", message)
    return scan.latest
