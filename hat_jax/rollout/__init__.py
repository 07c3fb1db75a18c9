"""A policy in the world: the sampler interface and its JAX implementation, multi-turn episodes in the simulator
with exact token bookkeeping, single-turn completions, and the per-token log-probs they are rescored with.

Modules: `sampler` (the `Sampler` protocol, `JaxSampler`, buckets), `turns` (token bookkeeping of a turn, the
reasoning-length count), `episodes` (`rollout_episodes`), `completions` (`sample_completions`,
`chat_completions`), `logprobs` (`token_logprobs`), `checkpoint` (`load_sampler`, `tokenizer_from_checkpoint`).
The message-level loop of a Python policy (the oracle teacher, rejection sampling) is the simulator's own
(`hat_jax.sim.rollout`), below the data pipelines that use it.
"""

from hat_jax.rollout.checkpoint import load_sampler, tokenizer_from_checkpoint
from hat_jax.rollout.completions import Completions, chat_completions, sample_completions
from hat_jax.rollout.episodes import RolloutBatch, RolloutConfig, forced_expert_ids, rollout_episodes
from hat_jax.rollout.sampler import DEFAULT_BUCKET, Generation, JaxSampler, Sampler
from hat_jax.rollout.turns import reasoning_tokens

__all__ = [
    "DEFAULT_BUCKET", "Completions", "Generation", "JaxSampler", "RolloutBatch", "RolloutConfig", "Sampler",
    "chat_completions", "forced_expert_ids", "load_sampler", "reasoning_tokens", "rollout_episodes",
    "sample_completions", "tokenizer_from_checkpoint",
]
