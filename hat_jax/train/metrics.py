"""Training metrics: TensorBoard event files (tensorboardX) plus a JSONL mirror, under fixed tag names.

One run directory per (experiment, stage, seed): `run_dir(root, experiment, stage, seed)` =
`<root>/<experiment>/<stage>/seed<seed>`, so `tensorboard --logdir <root>` overlays the ablation rows of a
table with the same tag in one chart. Every stage writes the same tags (unknown tags are an error, so a
typo cannot split a curve); `TAGS` is the list the writer accepts, docs/metrics.md says what each tag means.

Metric values are averaged over the steps of each log window. `metrics.jsonl` in the run directory gets one
line per write: {"step": int, "time": unix seconds, "<tag>": float, ...}. On resume from step k, JSONL lines
with a larger step are dropped and TensorBoard is told to purge events after k (`purge_step`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

from hat_jax.cache import write_text_atomic

TAGS: tuple[str, ...] = (
    "train/loss", "train/lb_loss", "train/total_loss", "train/grad_norm", "train/lr", "train/loss_tokens",
    "train/tokens_per_s", "train/mtp_loss", "moe/expert_load_cv", "moe/mtp_expert_load_cv", "data/hsa_share",
    "data/documents", "data/invalid_samples", "data/update_rows", "data/slot_fill", "policy/clip_frac",
    "policy/entropy", "policy/ratio_mean",
)
TAG_FAMILIES: tuple[str, ...] = ("eval/", "reward/", "adv/", "kl/", "rollout/", "time/", "policy/")
JSONL = "metrics.jsonl"


def run_dir(root: str | Path, experiment: str, stage: str, seed: int) -> Path:
    """`<root>/<experiment>/<stage>/seed<seed>` (not created)."""
    for name, value in (("experiment", experiment), ("stage", stage)):
        if not value or "/" in value or value.startswith("."):
            raise ValueError(f"run_dir: {name} {value!r} must be a plain, non-empty directory name")
    return Path(root) / experiment / stage / f"seed{int(seed)}"


def check_tag(tag: str) -> str:
    """Returns `tag` when it is in `TAGS` or one of `TAG_FAMILIES`; else ValueError listing them."""
    if tag in TAGS or any(tag.startswith(f) and len(tag) > len(f) for f in TAG_FAMILIES):
        return tag
    raise ValueError(f"unknown metric tag {tag!r}; known tags: {', '.join(TAGS)}; "
                     f"families: {', '.join(f + '<name>' for f in TAG_FAMILIES)}")


class MetricsWriter:
    """Scalar writer for one run directory: TensorBoard events + `metrics.jsonl`.

    Args:
        directory: the run directory (created).
        resume_step: when resuming from a checkpoint at this step, drop later JSONL lines and purge later
            TensorBoard events (they belong to the steps being redone).
        tensorboard: write event files (False: JSONL only).
    """

    def __init__(self, directory: str | Path, *, resume_step: int | None = None, tensorboard: bool = True):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / JSONL
        if resume_step is not None and self.jsonl.exists():
            kept = [line for line in self.jsonl.read_text(encoding="utf-8").splitlines()
                    if line.strip() and _step_of(line) <= resume_step]
            write_text_atomic(self.jsonl, "".join(line + "\n" for line in kept))
        self.tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            # A unique suffix: a resumed process started within the same second must not overwrite the file.
            self.tb = SummaryWriter(logdir=str(self.dir), purge_step=purge, flush_secs=30,
                                    filename_suffix=f".{os.getpid()}.{time.time_ns()}")

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Writes {tag: value} at `step` (tags checked by `check_tag`). A non-finite value (NaN: a share with an
        empty denominator, such as rollout/name_valid of a step without calls) is null in JSONL and left out of
        TensorBoard, a gap in its curve; a non-finite loss or gradient never reaches here, since the trainer stops
        on it (`hat_jax.train.trainer.NonFiniteLossError`)."""
        row = {"step": int(step), "time": time.time()}
        for tag, value in values.items():
            check_tag(tag)
            value = float(value)
            row[tag] = value if math.isfinite(value) else None
            if self.tb is not None and row[tag] is not None:
                self.tb.add_scalar(tag, value, int(step))
        with self.jsonl.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """A text note in TensorBoard (e.g. the stage config); not mirrored."""
        if self.tb is not None:
            self.tb.add_text(tag, text, step)

    def flush(self) -> None:
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return -1


def read_metrics(directory: str | Path) -> list[dict]:
    """The rows of `<directory>/metrics.jsonl` (empty list when absent)."""
    path = Path(directory) / JSONL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_event_scalars(directory: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} read back from the TensorBoard event files of a run directory, in file
    (creation) order, applying purges as TensorBoard does (a session START at step s drops values at >= s)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    paths = sorted(Path(directory).glob("events.out.tfevents.*"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    for path in paths:
        for event in _read_events(path):
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                out = {tag: [(s, v) for s, v in vals if s < event.step] for tag, vals in out.items()}
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return out


def _read_events(path: Path):
    """Yields `Event` protos from a TFRecord file (length, crc, payload, crc; CRCs not checked)."""
    import struct

    from tensorboardX.proto import event_pb2

    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        payload = data[pos + 12: pos + 12 + length]
        pos += 12 + length + 4
        event = event_pb2.Event()
        event.ParseFromString(payload)
        yield event
