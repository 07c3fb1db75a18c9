"""The official IFEval prompts (Zhou et al. 2023, arXiv 2311.07911): where they are read from, and checks.

Sources, in order (`load_ifeval`):
1. a local `input_data.jsonl` (google-research `instruction_following_eval/data/input_data.jsonl`):
   `EvalConfig.ifeval_data`, else the environment variable `HAT_IFEVAL_DATA`. The file must have the
   official 541 lines and sha256 `IFEVAL_SHA256`; anything else is an error naming the file and both
   values. A path that is given but does not exist is an error too (no silent fallback to the hub).
2. otherwise the Hugging Face hub dataset `google/IFEval` through `datasets.load_dataset` (for users with a
   network); its rows must number 541. The hub is not tried in offline mode (`HF_HUB_OFFLINE` /
   `HF_DATASETS_OFFLINE`) or when a 3-second TCP connection to the hub's host fails (`datasets` would
   otherwise retry for about half a minute). The hub rows carry every kwarg name with None for the unused ones;
   the None values are dropped, which gives the official file's kwargs.
3. otherwise nothing: `load_ifeval` returns None and logs a warning naming where it looked and how to
   provide the file (IFEval is then reported as skipped).
The data is only evaluated on, never trained on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

IFEVAL_LINES = 541
IFEVAL_SHA256 = "67ffeee0fcb87c317c5b08a2de85557b4a7e96ada6178aa645b4954fe4b53d49"
IFEVAL_ENV = "HAT_IFEVAL_DATA"
IFEVAL_HUB = "google/IFEval"
RECORD_KEYS: tuple[str, ...] = ("key", "prompt", "instruction_id_list", "kwargs")
HOW_TO_PROVIDE = (f"to score IFEval, download the official input_data.jsonl (google-research "
                  f"instruction_following_eval/data/input_data.jsonl, {IFEVAL_LINES} lines, sha256 {IFEVAL_SHA256}) "
                  f"and pass its path with `experiments/run.py --ifeval-data FILE`, as EvalConfig.ifeval_data or in the "
                  f"environment variable {IFEVAL_ENV}, or give this machine network access to the Hugging Face hub "
                  f"({IFEVAL_HUB})")
_OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the hub cannot serve the dataset now (offline mode, or no TCP connection to `$HF_ENDPOINT`'s host,
    default huggingface.co, within `timeout_s` seconds), or None when it may."""
    for name in _OFFLINE_ENV:
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{name} is set"
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as err:
        return f"no connection to {host}:{port} ({type(err).__name__}: {err})"


def _check_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict) or any(k not in record for k in RECORD_KEYS):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where}: expected an IFEval record with keys {RECORD_KEYS}, got {keys}")
    if len(record["instruction_id_list"]) != len(record["kwargs"]):
        raise ValueError(f"{where}: {len(record['instruction_id_list'])} instruction ids but "
                         f"{len(record['kwargs'])} kwargs")
    kwargs = [{k: v for k, v in dict(kw or {}).items() if v is not None} for kw in record["kwargs"]]
    return {"key": record["key"], "prompt": record["prompt"],
            "instruction_id_list": list(record["instruction_id_list"]), "kwargs": kwargs}


def read_verified(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The records of a local official IFEval file, after checking its line count and sha256.

    Args:
      path: the `input_data.jsonl` file. limit: keep the first `limit` records (the whole file is still
        verified); None keeps all 541.
    Returns:
      records {"key", "prompt", "instruction_id_list", "kwargs"} in file order.
    Raises:
      FileNotFoundError: no such file (the message says how to provide one).
      ValueError: a line count or sha256 other than the official one (names the file and both values), a
        line that is not an IFEval record, or limit < 1.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"IFEval data file {str(file)!r} does not exist; {HOW_TO_PROVIDE}")
    data = file.read_bytes()
    lines = data.decode("utf-8").splitlines()
    if len(lines) != IFEVAL_LINES:
        raise ValueError(f"IFEval data file {str(file)!r} has {len(lines)} lines; the official file has "
                         f"{IFEVAL_LINES}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != IFEVAL_SHA256:
        raise ValueError(f"IFEval data file {str(file)!r} has sha256 {digest}; the official file has "
                         f"{IFEVAL_SHA256}")
    if limit is not None and limit < 1:
        raise ValueError(f"ifeval_limit: expected None or an int >= 1, got {limit!r}")
    return [_check_record(json.loads(line), f"{file}:{i + 1}") for i, line in enumerate(lines[:limit])]


def _load_hub() -> list[Mapping[str, Any]]:
    """The rows of `google/IFEval` (train split) from the hub; raises whatever `datasets` raises."""
    import datasets

    return list(datasets.load_dataset(IFEVAL_HUB, split="train"))


def load_ifeval(path: str | Path | None = None, limit: int | None = None) -> tuple[list[dict[str, Any]], str] | None:
    """The official IFEval records from the first source that has them (module docstring).

    Args:
      path: a local file (EvalConfig.ifeval_data); None looks at $HAT_IFEVAL_DATA, then the hub.
      limit: the first `limit` records only (None: all 541).
    Returns:
      (records, source description) or None when no source has them (a warning is logged).
    Raises:
      FileNotFoundError / ValueError: see `read_verified` (a given file is missing or not the official one);
      ValueError: the hub returned another number of rows than 541.
    """
    env = os.environ.get(IFEVAL_ENV) or None
    chosen = path if path is not None else env
    if chosen is not None:
        where = "EvalConfig.ifeval_data" if path is not None else f"${IFEVAL_ENV}"
        return read_verified(chosen, limit), f"{chosen} ({where})"
    offline = hub_unreachable()
    if offline is not None:
        log.warning("IFEval skipped: no local file (EvalConfig.ifeval_data is not set, $%s is not set) and the hub "
                    "dataset %s is out of reach (%s); %s", IFEVAL_ENV, IFEVAL_HUB, offline, HOW_TO_PROVIDE)
        return None
    try:
        rows = _load_hub()
    except Exception as err:  # no `datasets`, the dataset is gated or moved, ...: IFEval is skipped
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        log.warning("IFEval skipped: no local file (EvalConfig.ifeval_data is not set, $%s is not set) and the "
                    "hub dataset %s could not be loaded (%s: %s); %s", IFEVAL_ENV, IFEVAL_HUB,
                    type(err).__name__, first, HOW_TO_PROVIDE)
        return None
    if len(rows) != IFEVAL_LINES:
        raise ValueError(f"hub dataset {IFEVAL_HUB} has {len(rows)} rows; the official set has {IFEVAL_LINES}")
    if limit is not None and limit < 1:
        raise ValueError(f"ifeval_limit: expected None or an int >= 1, got {limit!r}")
    return [_check_record(dict(r), f"{IFEVAL_HUB}[{i}]") for i, r in enumerate(rows[:limit])], f"hub {IFEVAL_HUB}"


def skip_reason(path: str | Path | None) -> str:
    """A one-line note for results when IFEval was skipped (where it looked)."""
    return (f"no IFEval data: EvalConfig.ifeval_data={path!r}, ${IFEVAL_ENV}={os.environ.get(IFEVAL_ENV)!r}, "
            f"hub {IFEVAL_HUB} unavailable; pass the official input_data.jsonl with --ifeval-data FILE")
