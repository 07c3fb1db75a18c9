"""The world's datasets, generated from seeds and cached on disk by the hash of their config.

What each stage reads (the HAT report, arXiv 2608.15763 (TaoLive, 2026),
"Training, three stages"):
- `sft_records`: HSA-SFT trajectories. The noisy oracle (`DEFAULT_NOISE`) rolls out training tasks
  under the original harness with a few injected tool faults; rejection sampling keeps an episode
  only when the rule judges give Accuracy 1 and Effectiveness 1 (the report's stage 1), trying each task
  up to `sft_attempts` times; retry trajectories are trimmed to the final behaviour except for a
  small share (`final_behaviour_only`). HSA variants are drawn per record by the Grain pipeline
  (`hat_jax.data.pipeline.sft_dataset`), which rewrites or re-rolls each trajectory under them.
- `rl_tasks`: interactive tasks for HSA-RL (own seed stream).
- `eval_items`: the four live-stream suites (`hat_jax.data.suites`), whose viewer messages are kept
  disjoint from the SFT and RL tasks'.
- general prompts (`hat_jax.data.general`) and the pretraining corpus (`hat_jax.data.corpus`) are
  pure functions of their seed and fast; they are not cached here.

Caching: `<cache root>/world-data/<kind>-<hash>.jsonl`, one JSON record per line, with a sidecar
`.meta.json` holding the config, counts and statistics. The hash covers the kind, the config and
`DATA_VERSION` (bump it when a generator changes its output). Files are written to a temporary name,
made world-readable (0644) and renamed into place, so a killed build never leaves a partial file.
A cache file that cannot be trusted is reported (a warning naming the file and the problem) and
rebuilt, since it is derived data: unreadable or non-UTF-8 bytes, a line that is not JSON, a meta
that is not a JSON object of this kind and version, a record count that differs from the meta's,
or a record its kind's validator rejects (`cached(..., validate=...)`: RL tasks and eval items must
survive a `from_dict`/`to_dict` round trip unchanged, so a dropped field is caught; SFT records are
checked by `check_sft_record`). The cache root is `$HAT_JAX_CACHE` or `~/.cache/hat-jax`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hat_jax.cache import write_text_atomic
from hat_jax.data.pipeline import RECORD_KEYS
from hat_jax.data.suites import SUITES, EvalItem, build_suite, item_from_dict, item_to_dict, training_messages
from hat_jax.judges.rules import judge_episode
from hat_jax.sim.catalog import MAX_PRODUCTS, MIN_PRODUCTS, World
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.executor import check_fault_rates
from hat_jax.sim.oracle import DEFAULT_NOISE, OracleConfig, OracleTeacher
from hat_jax.sim.rollout import rejection_sample
from hat_jax.sim.types import Task, task_from_dict, task_to_dict
from hat_jax.sim.viewers import sample_tasks
from hat_jax.sim.world_harness import harness_content_digest, world_harness

log = logging.getLogger(__name__)

DATA_VERSION = 1
SFT_TASK_SEED, RL_TASK_SEED = 1, 2  # seed streams of `sample_tasks` for training tasks
PRODUCTION = "production"  # harness id of the original harness in records
# Keys of an SFT record: the pipeline's `RECORD_KEYS` (what `sft_dataset` reads) plus the world's own.
SFT_RECORD_KEYS: tuple[str, ...] = (*RECORD_KEYS, "record_id", "task", "hook_retry_kept")


def _default_sft_faults() -> dict[str, float]:
    return {"error": 0.05, "timeout": 0.03, "empty": 0.02}


@dataclasses.dataclass(frozen=True)
class WorldDataConfig:
    """Sizes and seeds of the world's datasets.

    Attributes:
      world_seed, n_products: the catalog (`World.generate`).
      sft_tasks: training tasks tried by rejection sampling (the paper: 10k real samples).
      sft_attempts: rollouts per task before it is given up.
      sft_fault_rates: tool faults injected while rolling out SFT data (so retries and honest
        "cannot confirm" replies are in the data).
      oracle: the teacher's noise (`DEFAULT_NOISE`: about 12-14% of episodes rejected).
      rl_tasks: RL tasks (the paper: 4k).
      eval_items: items per live-stream suite (the paper: 978 / 978 / 2023 for both robustness sets).
      eval_seed: selects another eval item stream (multi-seed evaluation).
      harness: the original harness the world's data is written under and evaluated against: a shipped
        harness (`hat_jax/harnesses/<name>`: "production", the real preset's, or "compact", the tiny world's)
        or a harness folder's path. HSA composes its variants from it.
    """

    world_seed: int = 0
    n_products: int = 240
    sft_tasks: int = 2000
    sft_attempts: int = 2
    sft_fault_rates: Mapping[str, float] = dataclasses.field(default_factory=_default_sft_faults)
    oracle: OracleConfig = DEFAULT_NOISE
    rl_tasks: int = 1000
    eval_items: int = 200
    eval_seed: int = 0
    harness: str = PRODUCTION

    def __post_init__(self) -> None:
        bounds = {
            "world_seed": (None, None),
            "eval_seed": (None, None),
            "n_products": (MIN_PRODUCTS, MAX_PRODUCTS),
            "sft_tasks": (0, None),
            "sft_attempts": (1, None),
            "rl_tasks": (0, None),
            "eval_items": (0, None),
        }
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool)
            ok = ok and (low is None or value >= low) and (high is None or value <= high)
            if not ok:
                what = "an int" if low is None else f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
                raise ValueError(f"WorldDataConfig.{name} = {value!r}: expected {what}")
        check_fault_rates(self.sft_fault_rates, "WorldDataConfig.sft_fault_rates")
        if not isinstance(self.oracle, OracleConfig):
            raise ValueError(f"WorldDataConfig.oracle: expected an OracleConfig, got {type(self.oracle).__name__}")
        if not isinstance(self.harness, str) or not self.harness:
            raise ValueError(f"WorldDataConfig.harness = {self.harness!r}: expected a harness name or folder path")
        try:
            world_harness(self.harness)
        except Exception as e:  # a missing folder (ValueError) or a harness that fails validation (HarnessError)
            raise ValueError(f"WorldDataConfig.harness = {self.harness!r}: {e}") from e

    def digest(self, kind: str) -> str:
        """12 hex digits of the hash of (kind, this config, DATA_VERSION, the harness files' content)."""
        blob = json.dumps({"kind": kind, "version": DATA_VERSION, "config": dataclasses.asdict(self),
                           "harness": harness_content_digest(self.harness)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_root() -> Path:
    """`$HAT_JAX_CACHE` or `~/.cache/hat-jax`."""
    return Path(os.environ.get("HAT_JAX_CACHE") or Path.home() / ".cache" / "hat-jax")


@functools.lru_cache(maxsize=8)
def world_for(world_seed: int, n_products: int) -> World:
    """The catalog of (world_seed, n_products), built once per process."""
    return World.generate(seed=world_seed, n_products=n_products)


def _write_atomic(path: Path, lines: list[str], meta: Mapping[str, Any]) -> None:
    """The records file, then its meta file, each written atomically (mode 0644: shared derived data)."""
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    write_text_atomic(_meta_path(path), json.dumps(meta, ensure_ascii=False, indent=1))


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".jsonl") + ".meta.json")


Validate = Callable[[dict], Any]  # raises ValueError / TypeError / KeyError for an invalid record


def _round_trip(from_dict: Callable[[Mapping[str, Any]], Any], to_dict: Callable[[Any], dict]) -> Validate:
    """A validator: the record must parse and re-serialise to itself (so a dropped field is caught)."""

    def validate(record: dict) -> None:
        again = json.loads(json.dumps(to_dict(from_dict(record)), ensure_ascii=False))
        if again != record:
            diff = sorted(set(again) ^ set(record)) or sorted(k for k in again if again[k] != record.get(k))
            raise ValueError(f"the record does not round-trip (fields {diff})")

    return validate


def check_sft_record(record: Mapping[str, Any]) -> None:
    """Checks one SFT record as `sft_records` writes it (keys `SFT_RECORD_KEYS`).

    Raises:
      ValueError: a missing key or a field of the wrong shape (naming it): messages must be a non-empty
        list of message objects with a string "role", the ids strings, seed an int, "task" a task
        that round-trips through `task_from_dict`.
    """
    missing = [k for k in SFT_RECORD_KEYS if k not in record]
    if missing:
        raise ValueError(f"SFT record lacks {missing} (expected keys {SFT_RECORD_KEYS})")
    for key in ("record_id", "task_id", "harness_id"):
        if not isinstance(record[key], str):
            raise ValueError(f"SFT record field {key!r}: expected a string, got {record[key]!r}")
    if isinstance(record["seed"], bool) or not isinstance(record["seed"], int):
        raise ValueError(f"SFT record field 'seed': expected an int, got {record['seed']!r}")
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("SFT record field 'messages': expected a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"SFT record field 'messages[{i}]': expected a message object with a string 'role'")
    if not isinstance(record["hook_retry_kept"], bool):
        raise ValueError(f"SFT record field 'hook_retry_kept': expected a bool, got {record['hook_retry_kept']!r}")
    if not isinstance(record["task"], dict):
        raise ValueError("SFT record field 'task': expected a task object")
    _round_trip(task_from_dict, task_to_dict)(record["task"])


def _read_cached(path: Path, kind: str, validate: Validate | None) -> tuple[list[dict], dict] | None:
    """(records, meta) from a cache file, or None when absent or untrustworthy (logged with the file)."""
    if not path.exists() or not _meta_path(path).exists():
        return None

    def reject(problem: str) -> None:
        log.warning("world data cache %s: %s; rebuilding it", path, problem)

    try:
        meta = json.loads(_meta_path(path).read_text(encoding="utf-8"))
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return reject(f"unreadable ({type(err).__name__}: {err})")
    if not isinstance(meta, dict):
        return reject(f"its meta {_meta_path(path).name} is a JSON {type(meta).__name__}, not an object")
    if meta.get("kind") != kind or meta.get("version") != DATA_VERSION:
        return reject(f"its meta is for kind {meta.get('kind')!r} version {meta.get('version')!r}")
    records = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"expected a JSON object, got {type(record).__name__}")
            if validate is not None:
                validate(record)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:  # JSONDecodeError is a ValueError
            return reject(f"line {number} is not a valid {kind} record ({type(err).__name__}: {err})")
        records.append(record)
    if len(records) != meta.get("n_records"):
        return reject(f"it has {len(records)} records, its meta says {meta.get('n_records')!r}")
    return records, meta


def cached(
    kind: str,
    config: WorldDataConfig,
    build: Callable[[], tuple[list[dict], dict]],
    cache_dir: Path | None = None,
    validate: Validate | None = None,
) -> tuple[list[dict], dict]:
    """Records of `kind` for `config`: read from the cache, or built by `build()` and cached.

    Args:
      kind: the dataset kind (part of the file name and the hash).
      config: the datasets' config (hashed).
      build: () -> (records, statistics), called on a cache miss.
      cache_dir: the cache folder; default `cache_root() / "world-data"`.
      validate: record -> None, raising ValueError/TypeError/KeyError for a record that is not valid
        for this kind; applied to every record read from the cache (an invalid one rebuilds the file).
    Returns:
      (records, meta); meta holds "kind", "version", "config", "n_records" and the builder's
      statistics "stats" (as stored in the sidecar), plus "from_cache": True when read from the
      cache, False when built now (not stored).
    """
    path = Path(cache_dir or cache_root() / "world-data") / f"{kind}-{config.digest(kind)}.jsonl"
    hit = _read_cached(path, kind, validate)
    if hit is not None:
        records, meta = hit
        return records, {**meta, "from_cache": True}
    records, stats = build()
    meta = {"kind": kind, "version": DATA_VERSION, "config": dataclasses.asdict(config), "n_records": len(records), "stats": stats}
    _write_atomic(path, [json.dumps(r, ensure_ascii=False) for r in records], meta)
    return records, {**json.loads(json.dumps(meta, ensure_ascii=False)), "from_cache": False}


def sft_env_config(config: WorldDataConfig) -> EnvConfig:
    """The environment the SFT records are rolled out in: `config.sft_fault_rates`, the default turn limits."""
    return EnvConfig(fault_rates=dict(config.sft_fault_rates))


def oracle_records(config: WorldDataConfig, tasks: Sequence[Task], prefix: str = "sft") -> tuple[list[dict], dict]:
    """The oracle's rejection-sampled trajectories of `tasks` under the world's harness (`config.harness`), as SFT
    records.

    Args:
      config: the world, oracle noise, fault rates and attempts. tasks: the tasks to roll out.
      prefix: the record ids' prefix ("<prefix>-000000", ...).
    Returns:
      (records in `sft_records`' layout, `RejectionStats` as a dict).
    """
    world, harness = world_for(config.world_seed, config.n_products), world_harness(config.harness)
    oracle = OracleTeacher(world, config.oracle)
    env = LiveStreamEnv(world, sft_env_config(config))
    judge = functools.partial(judge_episode, harness=harness)
    kept, stats = rejection_sample(env, oracle, tasks, harness, judge, attempts=config.sft_attempts)
    records = []
    for i, episode in enumerate(kept):
        messages = oracle.sft_messages(episode)
        records.append({
            "record_id": f"{prefix}-{i:06d}",
            "task_id": episode.task.task_id,
            "harness_id": config.harness,
            "seed": episode.seed,
            "messages": [dict(m) for m in messages],
            "task": task_to_dict(episode.task),
            "hook_retry_kept": any(m["role"] == "tool" and '"hook"' in m["content"] for m in messages),
        })
    return records, dataclasses.asdict(stats)


def _build_sft(config: WorldDataConfig) -> tuple[list[dict], dict]:
    world = world_for(config.world_seed, config.n_products)
    return oracle_records(config, sample_tasks(world, config.sft_tasks, SFT_TASK_SEED))


def sft_records(config: WorldDataConfig = WorldDataConfig(), cache_dir: Path | None = None) -> tuple[list[dict], dict]:
    """Rejection-sampled SFT trajectory records (see the module docstring), cached.

    Returns:
      (records, meta). A record: {"record_id", "task_id", "harness_id" (`config.harness`), "seed" (the env's
      fault seed), "messages" (OpenAI format, system prompt of that harness first), "task"
      (`task_to_dict`), "hook_retry_kept" (a tool failure and the hook's retry feedback are kept)} — the keys
      `hat_jax.data.pipeline.sft_dataset` reads. meta["stats"] holds `RejectionStats` (rejection rate,
      per-intent counts, reject reasons); meta["from_cache"] says whether the records were read
      from the cache.
    """
    return cached("sft", config, lambda: _build_sft(config), cache_dir, check_sft_record)


def rl_tasks(config: WorldDataConfig = WorldDataConfig(), cache_dir: Path | None = None) -> list[Task]:
    """The HSA-RL tasks (own seed stream; messages may repeat SFT ones, as tasks do in the paper), cached."""
    def build() -> tuple[list[dict], dict]:
        tasks = sample_tasks(world_for(config.world_seed, config.n_products), config.rl_tasks, RL_TASK_SEED)
        return [task_to_dict(t) for t in tasks], {}

    records, _ = cached("rl", config, build, cache_dir, _round_trip(task_from_dict, task_to_dict))
    return [task_from_dict(r) for r in records]


def eval_items(suite: str, config: WorldDataConfig = WorldDataConfig(), cache_dir: Path | None = None) -> list[EvalItem]:
    """`config.eval_items` items of `suite`, none with a viewer message of the SFT or RL tasks, cached.

    Raises:
      ValueError: unknown suite.
    """
    if suite not in SUITES:
        raise ValueError(f"suite: unknown {suite!r}; expected one of {SUITES}")

    def build() -> tuple[list[dict], dict]:
        world = world_for(config.world_seed, config.n_products)
        exclude = training_messages(world, max(config.sft_tasks, config.rl_tasks), (SFT_TASK_SEED, RL_TASK_SEED))
        items = build_suite(world, suite, config.eval_items, seed=config.eval_seed, exclude=exclude)
        return [item_to_dict(it) for it in items], {}

    records, _ = cached(f"eval-{suite}", config, build, cache_dir, _round_trip(item_from_dict, item_to_dict))
    return [item_from_dict(r) for r in records]
