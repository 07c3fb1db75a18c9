"""General-domain prompts from the Hugging Face hub (Tulu 3 SFT mixture), or the same data on disk.

Variant implemented and why:
- At real scale, on-policy distillation samples general prompts from `allenai/tulu-3-sft-mixture`
  (Lambert et al. 2024, "Tulu 3: Pushing Frontiers in Open Language Model Post-Training",
  arXiv 2411.15124) instead of our tiny IFEval-style templates (`general.py`). Its rows are
  {`id`, `messages` (OpenAI-format chat), `source`}; the prompt is the first user turn.
- One code path, `datasets.load_dataset`, reads the hub dataset (streamed by default) or a local
  copy in the same schema: a parquet/jsonl/json file or a folder of them. Offline (HF_HUB_OFFLINE=1,
  as on these machines and in the tests) the hub path fails with an error that names the dataset and
  says to pass a local path; nothing falls back silently.
- Sampling is deterministic per seed: `shuffle(seed=seed)` (a buffer shuffle when streaming), then the
  first n rows that have a non-empty user turn. (A streamed read of parquet ends with datasets'
  `config.SLEEP_TIME_ON_THREADS_SHUTDOWN` wait, 5 s in datasets 5.x: a workaround for Arrow threads.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets

from hat_jax.data.general import GeneralPrompt

TULU_SOURCE = "allenai/tulu-3-sft-mixture"
_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
_SHUFFLE_BUFFER = 10_000


class HubDataError(RuntimeError):
    """The prompt dataset could not be loaded (offline hub, bad local files, wrong schema)."""


def _local_files(path: Path) -> tuple[str, list[str]]:
    """(datasets builder, data files) for a local file or folder in Tulu's schema."""
    files = sorted(p for p in path.rglob("*") if p.suffix in _BUILDERS) if path.is_dir() else [path]
    if not files:
        raise HubDataError(f"{str(path)!r} holds no .parquet, .jsonl or .json files")
    builders = {_BUILDERS.get(p.suffix) for p in files}
    if None in builders:
        raise HubDataError(f"{str(path)!r}: expected a .parquet, .jsonl or .json file, got {files[0].suffix!r}")
    if len(builders) > 1:
        raise HubDataError(f"{str(path)!r} mixes parquet and json files; keep one format per folder")
    return builders.pop(), [str(p) for p in files]  # type: ignore[return-value]


def first_user_turn(messages: Any) -> str | None:
    """The content of the first `user` message of an OpenAI-format chat (None if there is none)."""
    for message in messages or ():
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) and content.strip() else None
    return None


def load_tulu_prompts(
    n: int,
    seed: int,
    *,
    source: str | Path = TULU_SOURCE,
    split: str = "train",
    streaming: bool = True,
    cache_dir: str | Path | None = None,
) -> list[GeneralPrompt]:
    """`n` user prompts from the Tulu 3 SFT mixture (or a local copy), deterministic per seed.

    Args:
      n: number of prompts wanted (>= 0); fewer come back when the data holds fewer usable rows.
      seed: shuffle seed.
      source: a hub dataset id, or a local parquet/jsonl/json file or folder with Tulu's columns
        `id`, `messages`, `source`.
      split: the split to read ("train": local files are all read as "train").
      streaming: stream the rows (no full download) instead of materialising the dataset.
      cache_dir: the `datasets` cache folder (default: HF_DATASETS_CACHE).
    Returns:
      GeneralPrompt records: key = the row's `id`, prompt = its first user turn, empty
      instruction_id_list and kwargs (no verifiable instructions).
    Raises:
      ValueError: negative n.
      HubDataError: the hub is unreachable or offline (names the dataset; pass a local path), a
        local path without data files, or rows without the `messages` column.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    path = Path(source)
    if path.exists():
        builder, files = _local_files(path)
        where = str(path)
        try:
            data = datasets.load_dataset(
                builder, data_files={"train": files}, split=split, streaming=streaming, cache_dir=cache_dir
            )
        except Exception as err:  # datasets raises ValueError/ArrowInvalid/... on unreadable files
            raise HubDataError(f"could not read prompts from {where!r} (split {split!r}): {err}") from err
    else:
        where = str(source)
        try:
            data = datasets.load_dataset(where, split=split, streaming=streaming, cache_dir=cache_dir)
        except Exception as err:  # offline: ConnectionError/OSError/DatasetNotFoundError, version-dependent
            raise HubDataError(
                f"could not load dataset {where!r} (split {split!r}) from the Hugging Face hub: {err}. "
                "Offline (HF_HUB_OFFLINE=1) or without network, pass a local path in its schema "
                "(a parquet/jsonl file or folder with columns id, messages, source) as source=."
            ) from err
    if data.column_names is not None and "messages" not in data.column_names:
        raise HubDataError(f"{where!r}: rows lack the 'messages' column (columns: {data.column_names})")
    data = data.shuffle(seed=seed, buffer_size=_SHUFFLE_BUFFER) if streaming else data.shuffle(seed=seed)
    out: list[GeneralPrompt] = []
    for i, row in enumerate(data):
        if len(out) >= n:
            break
        if "messages" not in row:
            raise HubDataError(f"{where!r}: row {i} lacks the 'messages' column (keys: {sorted(row)})")
        prompt = first_user_turn(row["messages"])
        if prompt is not None:
            out.append(GeneralPrompt(key=str(row.get("id", i)), prompt=prompt, instruction_id_list=[], kwargs=[]))
    return out
