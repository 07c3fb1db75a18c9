"""What every cache and output folder of the project is written with: a content digest, atomic file and folder
writes, and an exclusive lock.

Conventions:
- `digest(data, n)`: the first n hex digits of the SHA-256 of `data` as canonical JSON (sorted keys, no spaces,
  `default=str` for anything JSON has no type for). Two configs that serialise alike share a key.
- `write_text_atomic` / `write_json_atomic`: the text goes to a temporary file beside the target, which then
  replaces it by one `os.replace` (atomic on POSIX): a reader sees the old file or the new one, never half of
  one, and a kill leaves at most a `.<name>.*.partial` file behind. Files are left mode 0644.
- `atomic_dir(target)`: a fresh temporary sibling folder to fill, renamed to `target` when the block ends
  without an error, removed when it raises. If another writer completed `target` first, its folder is kept
  and ours dropped (the writers of one target write the same content). `temp_sibling_dir` is the staging
  part alone, for writers that move files one at a time into a folder that already holds others.
- `exclusive_lock(path)`: an exclusive `fcntl.flock` held for a block; the OS releases it if the holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def digest(data: Any, n: int = 10) -> str:
    """First `n` hex digits of the SHA-256 of `data` as canonical JSON."""
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def write_text_atomic(path: str | Path, text: str) -> None:
    """Writes `text` (UTF-8) to `path` through a temporary sibling file and `os.replace`; creates the parent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, data: Any, *, indent: int = 1) -> None:
    """`data` as JSON (sorted keys, `default=str`, a final newline) written by `write_text_atomic`."""
    write_text_atomic(path, json.dumps(data, indent=indent, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def temp_sibling_dir(target: str | Path, *, clear_stale: bool = False) -> Iterator[Path]:
    """A fresh folder `.<target name>.partial-XXXX` beside `target`, removed when the block ends.

    clear_stale: first remove the partial folders of earlier writers of `target` (those a kill left); only for
        targets that a single process writes at a time.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.partial-"
    if clear_stale:  # also `.<name>.partial`, the name earlier versions used
        for stale in target.parent.glob(f".{target.name}.partial*"):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=prefix))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(target: str | Path, *, clear_stale: bool = False) -> Iterator[Path]:
    """Yields a temporary sibling folder that becomes `target` (mode 0755) by one rename when the block succeeds.

    An empty `target` is replaced; a non-empty one that exists by then (another writer finished first) is kept
    and the new folder dropped. `clear_stale` as in `temp_sibling_dir`.
    """
    target = Path(target)
    with temp_sibling_dir(target, clear_stale=clear_stale) as tmp:
        yield tmp
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            log.info("%s was written by another process first; keeping it", target)


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """An exclusive `flock` on `path` (created), held for the block; released by the OS if the process dies."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process holds %s; waiting for it", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
