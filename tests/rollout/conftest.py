"""Shared fixtures of the rollout tests: the `micro` model (fp32, CPU, random init, eos-biased:
`policy_helpers.eos_biased_params`), a BPE trained on the production harness and oracle episodes, and a small
harness whose Stop hook `reply_length_limit(max_chars=1)` blocks every reply once, so episodes have several turns.
"""

from __future__ import annotations

import json

import pytest
from policy_helpers import eos_biased_params

from hat_jax.harness.render import render_system_prompt, render_text
from hat_jax.harness.state import HookSpec
from hat_jax.model import get_config
from hat_jax.sim.env import LiveStreamEnv
from hat_jax.sim.oracle import OracleTeacher
from hat_jax.sim.rollout import rollout
from hat_jax.sim.viewers import sample_tasks
from hat_jax.tokenizer import train_bpe_tokenizer


@pytest.fixture(scope="session")
def small(harness):
    keep = ("get_stock", harness.skill_tool)
    return harness.replace(
        sections=harness.sections[:1], skills=harness.skills[:1],
        tools=tuple(t for t in harness.tools if t.name in keep),
        hooks=(HookSpec(event="Stop", handler="reply_length_limit", params={"max_chars": 1}),))


@pytest.fixture(scope="session")
def oracle_episodes(world, harness):
    tasks = sample_tasks(world, 6, seed=1)
    return [rollout(LiveStreamEnv(world), OracleTeacher(world), t, harness) for t in tasks]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory, harness, small, oracle_episodes):
    base = [render_system_prompt(harness), *(json.dumps(t, ensure_ascii=False) for t in harness.openai_tools()),
            *(s.body for s in harness.skills)]
    first = train_bpe_tokenizer(base, 300, tmp_path_factory.mktemp("bpe0"))   # only to render the corpus
    corpus = [render_text(first, harness, list(e.messages)) for e in oracle_episodes]
    corpus += [render_text(first, small, list(e.messages[:2]), add_generation_prompt=True) for e in oracle_episodes]
    return train_bpe_tokenizer(corpus * 2, get_config("micro").vocab_size, tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="session")
def config():
    return get_config("micro")


@pytest.fixture(scope="session")
def params(config):
    return eos_biased_params(config)
