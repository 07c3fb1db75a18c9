"""The world's datasets, generated from seeds and cached on disk by the hash of their config.

What each stage reads (issue 3 point 8; PAPER.md "Training, three stages"):
- `sft_records`: HSA-SFT trajectories. The noisy oracle (`DEFAULT_NOISE`) rolls out training tasks
  under the original harness with a few injected tool faults; rejection sampling keeps an episode
  only when the rule judges give Accuracy 1 and Effectiveness 1 (PAPER.md stage 1), trying each task
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
`DATA_VERSION` (bump it when a generator changes its output). Files are written to a temporary name
and renamed into place, so a killed build never leaves a partial file; an unreadable cache file is
reported and rebuilt (it is derived data). The cache root is `$HAT_JAX_CACHE` or `~/.cache/hat-jax`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hat_jax.data.suites import SUITES, EvalItem, build_suite, item_from_dict, item_to_dict, training_messages
from hat_jax.harness.loader import production_harness
from hat_jax.judges.rules import judge_episode
from hat_jax.sim.catalog import World
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.oracle import DEFAULT_NOISE, OracleConfig, OracleTeacher
from hat_jax.sim.rollout import rejection_sample
from hat_jax.sim.types import Task, task_from_dict, task_to_dict
from hat_jax.sim.viewers import sample_tasks

log = logging.getLogger(__name__)

DATA_VERSION = 1
SFT_TASK_SEED, RL_TASK_SEED = 1, 2  # seed streams of `sample_tasks` for training tasks
PRODUCTION = "production"  # harness id of the original harness in records


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

    def __post_init__(self) -> None:
        for name in ("n_products", "sft_tasks", "sft_attempts", "rl_tasks", "eval_items"):
            if getattr(self, name) < (1 if name in ("n_products", "sft_attempts") else 0):
                raise ValueError(f"WorldDataConfig.{name} = {getattr(self, name)}: expected a non-negative count")

    def digest(self, kind: str) -> str:
        """12 hex digits of the hash of (kind, this config, DATA_VERSION)."""
        blob = json.dumps({"kind": kind, "version": DATA_VERSION, "config": dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_root() -> Path:
    """`$HAT_JAX_CACHE` or `~/.cache/hat-jax`."""
    return Path(os.environ.get("HAT_JAX_CACHE") or Path.home() / ".cache" / "hat-jax")


@functools.lru_cache(maxsize=8)
def world_for(world_seed: int, n_products: int) -> World:
    """The catalog of (world_seed, n_products), built once per process."""
    return World.generate(seed=world_seed, n_products=n_products)


def _write_atomic(path: Path, lines: list[str], meta: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, text in ((path, "".join(line + "\n" for line in lines)), (_meta_path(path), json.dumps(meta, ensure_ascii=False, indent=1))):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{target.name}.", suffix=".partial")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".jsonl") + ".meta.json")


def _read_cached(path: Path) -> tuple[list[dict], dict] | None:
    """(records, meta) from a cache file, or None when absent or unreadable (logged)."""
    if not path.exists() or not _meta_path(path).exists():
        return None
    try:
        meta = json.loads(_meta_path(path).read_text(encoding="utf-8"))
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    except (OSError, json.JSONDecodeError) as err:
        log.warning("world data cache %s is unreadable (%s); rebuilding it", path, err)
        return None
    if len(records) != meta.get("n_records"):
        log.warning("world data cache %s has %d records, its meta says %s; rebuilding it", path, len(records), meta.get("n_records"))
        return None
    return records, meta


def cached(kind: str, config: WorldDataConfig, build: Callable[[], tuple[list[dict], dict]], cache_dir: Path | None = None) -> tuple[list[dict], dict]:
    """Records of `kind` for `config`: read from the cache, or built by `build()` and cached.

    Returns:
      (records, meta); meta holds "kind", "config", "n_records" and the builder's statistics.
    """
    path = Path(cache_dir or cache_root() / "world-data") / f"{kind}-{config.digest(kind)}.jsonl"
    hit = _read_cached(path)
    if hit is not None:
        return hit
    records, stats = build()
    meta = {"kind": kind, "version": DATA_VERSION, "config": dataclasses.asdict(config), "n_records": len(records), "stats": stats}
    _write_atomic(path, [json.dumps(r, ensure_ascii=False) for r in records], meta)
    return records, meta


def _build_sft(config: WorldDataConfig) -> tuple[list[dict], dict]:
    world, harness = world_for(config.world_seed, config.n_products), production_harness()
    tasks = sample_tasks(world, config.sft_tasks, SFT_TASK_SEED)
    oracle = OracleTeacher(world, config.oracle)
    env = LiveStreamEnv(world, EnvConfig(fault_rates=dict(config.sft_fault_rates)))
    judge = functools.partial(judge_episode, harness=harness, world=world)
    kept, stats = rejection_sample(env, oracle, tasks, harness, judge, attempts=config.sft_attempts)
    records = []
    for i, episode in enumerate(kept):
        messages = oracle.sft_messages(episode)
        records.append({
            "record_id": f"sft-{i:06d}",
            "task_id": episode.task.task_id,
            "harness_id": PRODUCTION,
            "seed": episode.seed,
            "messages": [dict(m) for m in messages],
            "task": task_to_dict(episode.task),
            "hook_retry_kept": any(m["role"] == "tool" and '"hook"' in m["content"] for m in messages),
        })
    return records, dataclasses.asdict(stats)


def sft_records(config: WorldDataConfig = WorldDataConfig(), cache_dir: Path | None = None) -> tuple[list[dict], dict]:
    """Rejection-sampled SFT trajectory records (see the module docstring), cached.

    Returns:
      (records, meta). A record: {"record_id", "task_id", "harness_id": "production", "seed" (the env's
      fault seed), "messages" (OpenAI format, system prompt of the production harness first), "task"
      (`task_to_dict`), "hook_retry_kept" (a tool failure and the hook's retry feedback are kept)} — the keys
      `hat_jax.data.pipeline.sft_dataset` reads. meta["stats"] holds `RejectionStats` (rejection rate,
      per-intent counts, reject reasons).
    """
    return cached("sft", config, lambda: _build_sft(config), cache_dir)


def rl_tasks(config: WorldDataConfig = WorldDataConfig(), cache_dir: Path | None = None) -> list[Task]:
    """The HSA-RL tasks (own seed stream; messages may repeat SFT ones, as tasks do in the paper), cached."""
    def build() -> tuple[list[dict], dict]:
        tasks = sample_tasks(world_for(config.world_seed, config.n_products), config.rl_tasks, RL_TASK_SEED)
        return [task_to_dict(t) for t in tasks], {}

    records, _ = cached("rl", config, build, cache_dir)
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

    records, _ = cached(f"eval-{suite}", config, build, cache_dir)
    return [item_from_dict(r) for r in records]
