"""Multi-turn episodes of a model policy in `LiveStreamEnv`, with exact token bookkeeping (RL, OPD, evaluation).

Variant implemented and why:
- N = len(tasks) * G episodes (task-major: episode n is sample n % G of task n // G, group id n // G), each
  in its own `LiveStreamEnv` reset with the task's own fault seed, so the G samples of a group face the same
  faults (the advantage compares policies, not luck).
- Turns are batched: every turn, the episodes still running go to `Sampler.generate` together (in a
  power-of-two number of rows with `batch_bucketing`, else always N rows), which samples one assistant turn
  for each, stopping at `<|im_end|>` (the tokenizer's eos). Each prefill re-reads the whole conversation (no
  cache is kept between turns: simple, and exact since the environment's tokens sit between turns). The
  sampled text, decoded with special tokens kept, goes to `env.step_text`; if the episode goes on, the
  environment's turn (`env_turn_ids`: tool responses / hook feedback + the next generation prompt) is
  appended. Sampled tokens are never re-tokenised (`hat_jax.rollout.turns`), so an episode's sequence is
  exactly prompt + sampled + environment + sampled ... tokens, and `old_logprobs` are the sampler's. Without
  hook feedback and with canonically written turns, its text equals `render_text` of the episode's messages
  (without the final newline); after a hook's user message the template would drop earlier turns' reasoning
  (Qwen's rule), the sequence keeps what the model saw.
- Ends and truncation (`RolloutBatch.truncated`): an episode ends when the environment says done (its
  outcome is the env's); it is cut, with `truncated=True`, when a turn stops without `<|im_end|>`
  (max_new_tokens reached: the partial text is NOT given to the environment), when its sequence reaches the
  `seq_len` cap (sampled tokens past the cap are dropped; likewise not given to the environment), when the
  environment's next turn would not leave room for one sampled token, or after `max_turns` model turns. A cut
  episode's `Episode` is `env.episode()` at that point with outcome "truncated" (the judges score it as a cut
  episode: Accuracy 0, no reply), its last partial turn absent from the messages (it is in `turn_texts`). A
  sequence always ends with a sampled token, never with environment text.
- Routing replay (R3; Ma et al. 2025, "Stabilizing MoE RL by aligning training and inference routers"),
  `record_expert_ids=True`: each token's top-k experts per layer *at sampling time* (`RolloutBatch.expert_ids`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.harness.render import render_ids
from hat_jax.harness.state import HarnessState
from hat_jax.model.sampling import SamplingConfig
from hat_jax.rollout.sampler import Generation, Sampler, batch_bucket, round_up
from hat_jax.rollout.turns import check_lengths, decode, env_turn_ids, right_pad, turn_sampling
from hat_jax.sim.catalog import World
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.types import Episode, Task


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How episodes are rolled out (module docstring).

    Attributes:
      sampling: decoding of each model turn; its max_new_tokens is the per-turn budget (stop and pad ids are
        replaced by the tokenizer's eos and pad).
      group_size: G episodes per task (>= 1). max_turns: model turns per episode at most (>= 1).
      seq_len: cap on an episode's tokens (None: max_position_embeddings - max_new_tokens).
      record_expert_ids: record the routing for replay (`RolloutBatch.expert_ids`).
      batch_bucketing: run the live episodes in power-of-two batches (True) or always in N rows (False: one
        batch shape, more compute on finished rows).
      env: limits and fault rates of every episode (None: `EnvConfig()`), unless given per task.
    Raises (on construction):
      ValueError: group_size or max_turns < 1.
    """

    sampling: SamplingConfig
    group_size: int = 1
    max_turns: int = 8
    seq_len: int | None = None
    record_expert_ids: bool = False
    batch_bucketing: bool = True
    env: EnvConfig | None = None

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.max_turns < 1:
            raise ValueError(f"RolloutConfig: group_size={self.group_size} and max_turns={self.max_turns} must "
                             "both be >= 1")


@dataclasses.dataclass
class RolloutBatch:
    """The episodes as one batch, aligned as the losses are (entry t of a per-token array is about token t).
    N episodes, T columns (right padding).

    Attributes:
      input_ids, attention_mask, action_mask: np.int32 [N, T] (action 1 on sampled tokens only).
      old_logprobs: np.float32 [N, T], the sampler's log-probs of the sampled tokens, 0 elsewhere.
      expert_ids: np.int32 [L, N, T, k] routing at sampling time, or None (see below).
      group_ids: np.int32 [N], the task index of each episode.
      episodes: N `Episode`s (the env's record, for the judges).
      stats: tokens generated, seconds in generation / environment / tokenizer, turns, outcomes, ...
      truncated: np.bool_ [N], the episode was cut (module docstring).
      turn_texts: per episode, the decoded text of each sampled turn (what the env was given, or the
        cut text of a truncated last turn).

    Routing replay (`record_expert_ids=True`): `expert_ids[l, n, t]` are the top-k experts token t was routed to
    in layer l *at sampling time*: sampled tokens from the decode step that fed them back, prompt and environment
    tokens from the prefill of the turn that first read them (a turn's last sampled token from the next turn's
    prefill). `moe.route` has no partial force, so every position must hold valid ids: the positions never read
    during sampling (an episode's last token, right padding) get 0..k-1 (`fill_unrecorded`); no scored log-prob
    depends on their routing (causal model, padding masked). `stats["expert_ids_recorded"]` counts the recorded
    real positions.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    action_mask: np.ndarray
    old_logprobs: np.ndarray
    expert_ids: np.ndarray | None
    group_ids: np.ndarray
    episodes: list[Episode]
    stats: dict
    truncated: np.ndarray | None = None
    turn_texts: list[list[str]] | None = None


@dataclasses.dataclass
class _Live:
    """One episode while it runs."""

    env: LiveStreamEnv
    ids: list[int]
    action: list[int]
    logp: list[float]
    eids: np.ndarray | None                # [L, cap, k] int32, -1 = not recorded yet
    texts: list[str] = dataclasses.field(default_factory=list)
    done: bool = False
    truncated: bool = False

    def end(self, truncated: bool = False) -> None:
        self.done, self.truncated = True, truncated

    def extend(self, ids: Sequence[int], action: int, logp: Sequence[float] | None = None) -> None:
        self.ids += ids
        self.action += [action] * len(ids)
        self.logp += [0.0] * len(ids) if logp is None else list(logp)

    def record(self, start: int, ids: np.ndarray) -> None:
        """Stores routing ids [L, n, k] for positions start.. where none is recorded yet."""
        if self.eids is None:
            return
        n = min(ids.shape[1], self.eids.shape[1] - start)
        view = self.eids[:, start:start + n]
        fresh = (view < 0).all(axis=-1, keepdims=True) & (ids[:, :n] >= 0).all(axis=-1, keepdims=True)
        np.copyto(view, ids[:, :n], where=fresh)


def forced_expert_ids(expert_ids: np.ndarray | jax.Array) -> jax.Array:
    """RolloutBatch.expert_ids [L, N, T, k] -> the model's `forced_expert_ids` layout [L, N*T, k]."""
    num_layers, n, t, k = expert_ids.shape
    return jnp.asarray(expert_ids, jnp.int32).reshape(num_layers, n * t, k)


ID_BITS = 16  # bits per packed expert id: two ids per int32 word, experts < 65,536


def pack_expert_ids(expert_ids: np.ndarray) -> np.ndarray:
    """Routing ids [..., T, k] (ints in [0, 65,536)) -> [..., ceil(k/2), T] int32, ids 2w and 2w+1 of a token in
    the low and high 16 bits of word w, tokens last.

    The RL batch carries routing replay packed so: a TPU array tiles its two minor dimensions by (8, 128),
    so [..., T, k=8] int32 is stored 16 times its size, and the transpose to tokens-last is compiled as a
    layout copy of the whole step's input (15 GiB per chip for the 35B RL update on v6e-64); the packed words
    are stored at their size and unpacked per micro-batch by elementwise shifts (`unpack_expert_ids`).

    Raises:
        ValueError: an id outside [0, 65,536).
    """
    ids = np.asarray(expert_ids)
    if ids.size and (ids.min() < 0 or ids.max() >= 1 << ID_BITS):
        raise ValueError(f"expert_ids: expected ids in [0, {1 << ID_BITS}), got [{ids.min()}, {ids.max()}]")
    k = ids.shape[-1]
    if k % 2:
        ids = np.concatenate([ids, np.zeros(ids.shape[:-1] + (1,), ids.dtype)], axis=-1)
    low, high = ids[..., 0::2].astype(np.uint32), ids[..., 1::2].astype(np.uint32)
    return np.moveaxis((low | (high << ID_BITS)).view(np.int32), -1, -2)


def unpack_expert_ids(words: jax.Array, k: int) -> jax.Array:
    """`pack_expert_ids`'s inverse: [..., ceil(k/2), T] int32 -> [..., T, k] int32."""
    mask = (1 << ID_BITS) - 1
    ids = [(words[..., j // 2, :] >> (ID_BITS * (j % 2))) & mask for j in range(k)]
    return jnp.stack(ids, axis=-1).astype(jnp.int32)


def fill_unrecorded(expert_ids: np.ndarray) -> np.ndarray:
    """Replaces -1 (no routing recorded) by the ids 0..k-1 in place, so the array can be forced.

    Only positions whose routing no scored token depends on are left unrecorded (an episode's last
    token, right padding); forcing any valid ids there leaves every scored log-prob unchanged.
    """
    k = expert_ids.shape[-1]
    missing = (expert_ids < 0).any(axis=-1)
    expert_ids[missing] = np.arange(k, dtype=expert_ids.dtype)
    return expert_ids


class _Run:
    """The state of one `rollout_episodes` call: the sampler, limits, clocks and counters."""

    def __init__(self, sampler: Sampler, config: RolloutConfig):
        self.sampler, self.config = sampler, config
        self.tokenizer = sampler.tokenizer
        self.sampling = turn_sampling(config.sampling, self.tokenizer)
        self.cap = check_lengths(sampler.model_config, self.tokenizer, self.sampling.max_new_tokens, config.seq_len)
        self.clock, self.shapes = Counter(), set()
        self.calls = self.generated = 0

    def start(self, world: World, task: Task, harness: HarnessState, env_config: EnvConfig | None,
              index: int) -> _Live:
        """A reset environment and its prompt ids (ValueError when the prompt leaves no room below the cap)."""
        t0 = time.perf_counter()
        env = LiveStreamEnv(world, env_config)
        messages = env.reset(task, harness)
        t1 = time.perf_counter()
        ids = render_ids(self.tokenizer, harness, messages, add_generation_prompt=True)
        self.clock["env"] += t1 - t0
        self.clock["tokenizer"] += time.perf_counter() - t1
        if len(ids) >= self.cap:
            raise ValueError(f"task {task.task_id} (tasks[{index}]): the prompt has {len(ids)} tokens, no room "
                             f"below seq_len={self.cap}")
        mc = self.sampler.model_config
        eids = (np.full((mc.num_hidden_layers, self.cap, mc.num_experts_per_tok), -1, np.int32)
                if self.config.record_expert_ids else None)
        ep = _Live(env, ids, [0] * len(ids), [0.0] * len(ids), eids)
        if env.done:  # a UserPromptSubmit hook ended it before any turn
            ep.end()
        return ep

    def turn(self, running: list[_Live], total: int, rng: jax.Array) -> None:
        """One batched model turn of the `running` episodes (of `total`), then their environments' turns."""
        rows = batch_bucket(len(running), total) if self.config.batch_bucketing else total
        t0 = time.perf_counter()
        gen = self.sampler.generate([ep.ids for ep in running], self.sampling, jax.random.fold_in(rng, self.calls),
                                    rows=rows, expert_ids=self.config.record_expert_ids)
        self.clock["generation"] += time.perf_counter() - t0
        self.shapes.add(gen.batch_shape)
        self.calls += 1
        for r, ep in enumerate(running):
            self.advance(ep, gen, r)

    def advance(self, ep: _Live, gen: Generation, r: int) -> None:
        """Appends row r's sampled turn to `ep` and gives it to the environment (module docstring's rules)."""
        start, n = len(ep.ids), int(gen.lengths[r])
        if self.config.record_expert_ids:
            ep.record(0, gen.prompt_routing(r, start))
            ep.record(start, gen.expert_ids[:, r, :n])
        keep = min(n, self.cap - start)
        tokens = [int(t) for t in gen.tokens[r, :keep]]
        ep.extend(tokens, 1, [float(x) for x in gen.logprobs[r, :keep]])
        self.generated += keep
        t1 = time.perf_counter()
        text = decode(self.tokenizer, tokens)
        self.clock["tokenizer"] += time.perf_counter() - t1
        ep.texts.append(text)
        if keep < n or not bool(gen.finished[r]):
            ep.end(truncated=True)
            return
        t1 = time.perf_counter()
        result = ep.env.step_text(text)
        self.clock["env"] += time.perf_counter() - t1
        if result.done:
            ep.end()
            return
        if len(ep.texts) >= self.config.max_turns:
            ep.end(truncated=True)
            return
        t1 = time.perf_counter()
        suffix = env_turn_ids(self.tokenizer, result.new_messages)
        self.clock["tokenizer"] += time.perf_counter() - t1
        if len(ep.ids) + len(suffix) >= self.cap:
            ep.end(truncated=True)
            return
        ep.extend(suffix, 0)


def rollout_episodes(sampler: Sampler, world: World, tasks: Sequence[Task], harnesses: Sequence[HarnessState],
                     rng: jax.Array, config: RolloutConfig,
                     env_configs: Sequence[EnvConfig] | None = None) -> RolloutBatch:
    """Rolls the sampler's policy out on every task `config.group_size` times (module docstring).

    Args:
      sampler: the policy (for RL the same params as the old policy of the update).
      world: the catalog the environment runs over.
      tasks: the viewer requests; harnesses: one `HarnessState` per task (original or an HSA variant).
      rng: PRNG key (turn i samples with `fold_in(rng, i)`). config: the rollout settings.
      env_configs: one `EnvConfig` per task instead of `config.env` (all G episodes of task i run under
        env_configs[i]; evaluation items carry their own faults); `config.env` must then be None.
    Returns:
      RolloutBatch with N = len(tasks) * group_size rows.
    Raises:
      ValueError: no tasks, len(harnesses) != len(tasks), both config.env and env_configs given or
        len(env_configs) != len(tasks), a bad seq_len, or a prompt that leaves no room below the cap (names
        the task).
    """
    if not tasks:
        raise ValueError("rollout_episodes: no tasks given")
    if len(harnesses) != len(tasks):
        raise ValueError(f"harnesses: expected one per task ({len(tasks)}), got {len(harnesses)}")
    if env_configs is not None:
        if config.env is not None:
            raise ValueError("rollout_episodes: give RolloutConfig.env (one for all tasks) or env_configs (one per "
                             "task), not both")
        if len(env_configs) != len(tasks):
            raise ValueError(f"env_configs: expected one per task ({len(tasks)}), got {len(env_configs)}")
    envs = list(env_configs) if env_configs is not None else [config.env] * len(tasks)
    run = _Run(sampler, config)
    t_start = time.perf_counter()
    live = [run.start(world, task, harness, env, i)
            for i, (task, harness, env) in enumerate(zip(tasks, harnesses, envs)) for _ in range(config.group_size)]
    while running := [ep for ep in live if not ep.done]:
        run.turn(running, len(live), rng)
    return _assemble(live, len(tasks), run, time.perf_counter() - t_start)


def _stats(live: list[_Live], episodes: list[Episode], run: _Run, total: float, recorded: int) -> dict:
    turns = [len(ep.texts) for ep in live]
    gen_s = run.clock["generation"]
    return {
        "episodes": len(live),
        "tokens_generated": run.generated,
        "generation_s": gen_s,
        "env_s": run.clock["env"],
        "tokenizer_s": run.clock["tokenizer"],
        "total_s": total,
        "tokens_per_s": run.generated / gen_s if gen_s > 0 else 0.0,
        "s_per_episode": total / len(live),
        "turns": turns,
        "mean_turns": float(np.mean(turns)),
        "generate_calls": run.calls,
        "generate_shapes": sorted(s for s in run.shapes if s is not None),
        "outcomes": dict(Counter(e.outcome for e in episodes)),
        "truncated": int(sum(ep.truncated for ep in live)),
        "seq_lens": [len(ep.ids) for ep in live],
        "expert_ids_recorded": recorded,
    }


def _assemble(live: list[_Live], n_tasks: int, run: _Run, total: float) -> RolloutBatch:
    t = min(round_up(max(len(ep.ids) for ep in live), run.sampler.bucket), run.cap)
    pad = int(run.tokenizer.pad_token_id)
    expert_ids, recorded = None, 0
    if run.config.record_expert_ids:
        expert_ids = np.stack([ep.eids[:, :t] for ep in live], axis=1)           # [L, N, T, k]
        recorded = int(sum((ep.eids[0, :len(ep.ids)] >= 0).all(-1).sum() for ep in live))
        fill_unrecorded(expert_ids)
    episodes = [dataclasses.replace(ep.env.episode(), outcome="truncated") if ep.truncated else ep.env.episode()
                for ep in live]
    return RolloutBatch(
        input_ids=right_pad([ep.ids for ep in live], t, pad, np.int32),
        attention_mask=right_pad([[1] * len(ep.ids) for ep in live], t, 0, np.int32),
        action_mask=right_pad([ep.action for ep in live], t, 0, np.int32),
        old_logprobs=right_pad([ep.logp for ep in live], t, 0.0, np.float32),
        expert_ids=expert_ids,
        group_ids=np.repeat(np.arange(n_tasks, dtype=np.int32), run.config.group_size),
        episodes=episodes,
        stats=_stats(live, episodes, run, total, recorded),
        truncated=np.asarray([ep.truncated for ep in live], bool),
        turn_texts=[list(ep.texts) for ep in live],
    )
