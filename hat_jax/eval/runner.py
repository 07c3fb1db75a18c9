"""Everything a results.json scores: the four live-stream suites, IFEval and the in-domain ifeval_mini.

The HAT report, arXiv 2608.15763 (TaoLive, 2026), "Evaluation sets and metrics". `evaluate` returns

    {"live_qa": {"acc", "eff", "avg", + READING}, "variant_qa": {"acc", "eff", "avg", + READING},
     "tool_robustness": {"adr", "rc", "tc", "avg", + READING},
     "prompt_robustness": {"adr", "llm", "tco", "avg", + READING},
     "ifeval": {"prompt_strict", "inst_strict", "prompt_loose", "inst_loose"} or None (skipped),
     "ifeval_mini": {the same four} or None (ifeval_mini_items = 0),
     "mtp": {"acceptance_depth1", "mean_accepted_length", "positions", "episodes"} or None (not measured),
     "extra": {per suite: timing and length statistics; "seq_len", "wall_s", ...}}

every report metric a float on the paper's 0-100 scale; only the suites of `EvalConfig.suites` are present. READING
is the reading metrics of `hat_jax.judges.reading` ("name_valid", "skill_acc", "chain_done", "fact_fetched",
"relayed", "abstained" on 0-100 or None when undefined, "calls_per_ep" a count), not the report's and not in AVG.
Decoding is greedy by default (`EvalConfig.temperature` 0); with a temperature > 0 (e.g. the paper's serving
setting, 1.0 / top-p 0.95) every batch samples with a key derived from `EvalConfig.seed` and its index, so a
score is still a function of the params and the config.

- Live-stream suites: `hat_jax.eval.live` (items, harness and faults per item, rule judges, AVG).
- IFEval: the official 541 prompts (`hat_jax.eval.ifeval`: local verified file, hub, or skipped with a
  logged reason), single-turn greedy chat completions (`hat_jax.rollout.chat_completions`), the official checkers in
  our strict/loose loop (`hat_jax.eval.if_checker`; the reasoning block is cut before scoring). IFE-P is
  "prompt_*", IFE-I "inst_*".
- ifeval_mini: `ifeval_mini_items` held-out prompts of `hat_jax.data.general.general_prompts(n,
  world.eval_seed, "eval")` (official instruction ids, so the same checker loop scores them): the tiny
  model's general-capability gauge.
- `out_dir`: `<suite>.jsonl` (one line per item: item, per-sample scores, judgement, turn texts, episode),
  `ifeval.jsonl` / `ifeval_mini.jsonl` (one line per prompt: record, completion, scored response,
  verdicts) and `scores.json` (the returned dict).
- mtp: the MTP head's offline draft acceptance (`hat_jax.eval.mtp_acceptance.checkpoint_acceptance`): the share
  of positions where its greedy draft equals the main model's greedy next token, teacher-forced at depth 1 on
  the oracle trajectories of `mtp_items` held-out live_qa items (a share in [0, 1], not 0-100); None, with the
  reason in `extra["mtp"]["skipped"]`, for a model without an MTP block, a sampler that is not a `JaxSampler`,
  or `mtp_items` = 0. No timing: the speculative decode speed-up is a benchmark's
  (experiments/benchmarks/spec_decode_bench.py, export/check_vllm.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from hat_jax.data.suites import SUITES
from hat_jax.data.world_data import WorldDataConfig, eval_items, world_for
from hat_jax.eval.if_checker import response_text, score_responses
from hat_jax.eval.ifeval import IFEVAL_LINES, load_ifeval, skip_reason
from hat_jax.eval.live import run_live_suite
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.model.sampling import SamplingConfig
from hat_jax.rollout import JaxSampler, RolloutConfig, Sampler, chat_completions, load_sampler
from hat_jax.sim.world_harness import world_harness

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What `evaluate` runs.

    Attributes:
      world: the world's datasets config (catalog, eval item count per suite `world.eval_items`, eval seed;
        its SFT/RL task counts say which viewer messages to keep out of the eval items).
      suites: live-stream suites to run (`hat_jax.data.suites.SUITES` order or any subset).
      max_new_tokens: tokens per model turn. max_turns: model turns per episode.
      seq_len: tokens per episode at most (lowered to max_position_embeddings - max_new_tokens if above).
      batch_size: episodes / prompts per generation batch. bucket: prompt padding bucket (compilations).
      ifeval: run the official IFEval. ifeval_data: its local file (else $HAT_IFEVAL_DATA, else the hub,
        else skipped). ifeval_limit: only the first n of the 541 prompts (None: all).
      ifeval_mini_items: held-out general prompts to score (0: skip). if_max_new_tokens: tokens per
        IFEval / ifeval_mini completion.
      compute_dtype: "float32" or "bfloat16" (the sampler's compute dtype).
      temperature, top_p: decoding of every suite (0 = greedy; a small model decoded greedily can loop on
        one tool call, which sampling breaks). seed: the sampling keys (batch c uses fold_in(key(seed), c)).
      mtp_items: live_qa eval items whose oracle trajectories (cut to seq_len tokens) score the MTP draft
        acceptance (module docstring; one teacher-forced forward per episode, its [1, T, V] logits twice, padded
        to a multiple of `bucket`; no decoding); 0: skip. mtp_vocab_chunk: None computes those logits whole;
        a width takes the greedy tokens over vocabulary chunks of it instead (no [1, T, V] array; the same
        tokens), as the real preset needs (32,768 x 248,320 float32 logits are 30 GiB).
    Raises (on construction):
      ValueError: an unknown suite or dtype, or a count out of range (names the field and valid values).
    """

    world: WorldDataConfig = WorldDataConfig()
    suites: tuple[str, ...] = SUITES
    max_new_tokens: int = 128
    max_turns: int = 6
    seq_len: int = 3072
    batch_size: int = 32
    bucket: int = 256
    ifeval: bool = True
    ifeval_data: str | None = None
    ifeval_limit: int | None = None
    ifeval_mini_items: int = 100
    if_max_new_tokens: int = 256
    compute_dtype: str = "float32"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    mtp_items: int = 8
    mtp_vocab_chunk: int | None = None

    def __post_init__(self) -> None:
        SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=1)  # names a bad value
        if isinstance(self.suites, str) or not isinstance(self.suites, (tuple, list)):
            raise ValueError(f"EvalConfig.suites = {self.suites!r}: expected a list of suite names from {SUITES} "
                             "(or an empty list: IFEval and IF-mini only)")
        object.__setattr__(self, "suites", tuple(self.suites))
        bad = [s for s in self.suites if s not in SUITES]
        if bad or len(set(self.suites)) != len(self.suites):
            raise ValueError(f"EvalConfig.suites = {self.suites!r}: expected distinct names from {SUITES}")
        for name in ("max_new_tokens", "max_turns", "seq_len", "batch_size", "bucket", "if_max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EvalConfig.{name} = {value!r}: expected an int >= 1")
        for name in ("ifeval_mini_items", "mtp_items"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"EvalConfig.{name} = {n!r}: expected an int >= 0")
        chunk = self.mtp_vocab_chunk
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"EvalConfig.mtp_vocab_chunk = {chunk!r}: expected None or an int >= 1")
        lim = self.ifeval_limit
        if lim is not None and (isinstance(lim, bool) or not isinstance(lim, int) or not 1 <= lim <= IFEVAL_LINES):
            raise ValueError(f"EvalConfig.ifeval_limit = {lim!r}: expected None or an int in [1, {IFEVAL_LINES}]")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"EvalConfig.compute_dtype = {self.compute_dtype!r}; valid: {sorted(COMPUTE_DTYPES)}")
        if not isinstance(self.world, WorldDataConfig):
            raise ValueError(f"EvalConfig.world: expected a WorldDataConfig, got {type(self.world).__name__}")
        if self.suites and self.world.eval_items < 1:
            raise ValueError(f"EvalConfig.world.eval_items = {self.world.eval_items}: expected >= 1 when suites "
                             f"{self.suites} are run (or suites=())")

    def sampler(self, params: Any, model_config: Qwen3_5MoeTextConfig, tokenizer: Any) -> JaxSampler:
        """The JAX sampler these settings evaluate with: `compute_dtype` and the prompt `bucket`."""
        return JaxSampler(params, model_config, tokenizer, COMPUTE_DTYPES[self.compute_dtype], bucket=self.bucket)

    def sampling(self, max_new_tokens: int) -> SamplingConfig:
        """The decoding of every suite with a budget of `max_new_tokens` tokens per turn."""
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=max_new_tokens)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def _instruction_suite(name: str, records: list[dict[str, Any]], sampler: Sampler, config: EvalConfig,
                       progress: bool) -> tuple[dict, dict, list[dict]]:
    """Completions of `records` scored by the official checker loop: (scores, extra, per-prompt rows)."""
    t0 = time.perf_counter()
    comp = chat_completions(sampler, [r["prompt"] for r in records], config.sampling(config.if_max_new_tokens),
                            batch_size=config.batch_size, seed=config.seed, progress=progress, desc=name)
    responses = [response_text(t) for t in comp.texts]
    t1 = time.perf_counter()
    scores, verdicts = score_responses(records, responses)
    n = len(records)
    extra = {"prompts": float(n), "wall_s": time.perf_counter() - t0, "generation_s": comp.wall_s,
             "scoring_s": time.perf_counter() - t1, "completion_tokens": sum(comp.lengths) / n,
             "truncated_pct": 100.0 * sum(not f and not t for f, t in zip(comp.finished, comp.too_long)) / n,
             "too_long": float(sum(comp.too_long)),
             "empty_response_pct": 100.0 * sum(not r.strip() for r in responses) / n,
             "response_chars": sum(map(len, responses)) / n}
    rows = [{**r, "completion": c, "response": resp, "prompt_tokens": pt, "completion_tokens": k, "finished": f,
             "too_long": tl, **v.to_json()}
            for r, c, resp, pt, k, f, tl, v in zip(records, comp.texts, responses, comp.prompt_tokens, comp.lengths,
                                                   comp.finished, comp.too_long, verdicts)]
    if any(comp.too_long):
        log.warning("%s: %d of %d prompts do not fit max_position_embeddings=%d with %d new tokens; scored as "
                    "empty responses", name, sum(comp.too_long), n, sampler.model_config.max_position_embeddings,
                    config.if_max_new_tokens)
    return scores, extra, rows


def _live_suites(sampler: Sampler, config: EvalConfig, seq_len: int, out: Path | None,
                 progress: bool) -> tuple[dict, dict]:
    """Every live-stream suite of `config`: ({suite: scores}, {suite: extra}); writes `<suite>.jsonl`."""
    results, extra = {}, {}
    if not config.suites:
        return results, extra
    world = world_for(config.world.world_seed, config.world.n_products)
    original = world_harness(config.world.harness)
    episodes = RolloutConfig(config.sampling(config.max_new_tokens), max_turns=config.max_turns, seq_len=seq_len)
    for suite in config.suites:
        items = eval_items(suite, config.world)
        res = run_live_suite(sampler, suite, items, episodes, world=world, original=original,
                             batch_size=config.batch_size, seed=config.seed, progress=progress)
        results[suite], extra[suite] = res.scores, res.extra
        log.info("eval %s: %s (%d episodes, %.1f s)", suite,
                 " ".join(f"{k} {'-' if v is None else f'{v:.1f}'}" for k, v in res.scores.items()), len(items),
                 res.extra["wall_s"])
        if out is not None:
            _write_jsonl(out / f"{suite}.jsonl", res.records)
    return results, extra


def _instruction_suites(sampler: Sampler, config: EvalConfig, out: Path | None, progress: bool) -> tuple[dict, dict]:
    """IFEval and ifeval_mini: ({name: scores or None}, {name: extra or the reason it was skipped})."""
    results: dict[str, Any] = {"ifeval": None, "ifeval_mini": None}
    extra: dict[str, Any] = {}
    loaded = load_ifeval(config.ifeval_data, config.ifeval_limit) if config.ifeval else None
    if not config.ifeval:
        extra["ifeval"] = {"skipped": "EvalConfig.ifeval is False"}
    elif loaded is None:
        extra["ifeval"] = {"skipped": skip_reason(config.ifeval_data)}
    else:
        records, source = loaded
        scores, ex, rows = _instruction_suite("ifeval", records, sampler, config, progress)
        results["ifeval"], extra["ifeval"] = scores, {**ex, "source": source}
        log.info("eval ifeval (%d prompts from %s): %s", len(records), source,
                 " ".join(f"{k} {v:.1f}" for k, v in scores.items()))
        if out is not None:
            _write_jsonl(out / "ifeval.jsonl", rows)
    if config.ifeval_mini_items:
        from hat_jax.data.general import general_prompts

        records = [p.to_record() for p in general_prompts(config.ifeval_mini_items, config.world.eval_seed, "eval")]
        scores, ex, rows = _instruction_suite("ifeval_mini", records, sampler, config, progress)
        results["ifeval_mini"], extra["ifeval_mini"] = scores, ex
        log.info("eval ifeval_mini (%d prompts): %s", len(records), " ".join(f"{k} {v:.1f}" for k, v in scores.items()))
        if out is not None:
            _write_jsonl(out / "ifeval_mini.jsonl", rows)
    else:
        extra["ifeval_mini"] = {"skipped": "EvalConfig.ifeval_mini_items is 0"}
    return results, extra


def _mtp_acceptance(sampler: Sampler, config: EvalConfig, seq_len: int) -> tuple[dict | None, dict]:
    """The "mtp" figures of the module docstring and their extra ({"skipped": reason} when not measured)."""
    if not config.mtp_items:
        return None, {"skipped": "EvalConfig.mtp_items is 0"}
    if not isinstance(sampler, JaxSampler):
        return None, {"skipped": f"the sampler is a {type(sampler).__name__}, not a JaxSampler (no params to run "
                                 "the teacher-forced forward on)"}
    model_config = sampler.model_config
    if not model_config.mtp_num_hidden_layers:
        return None, {"skipped": "the model has no MTP block (mtp_num_hidden_layers = 0)"}
    from hat_jax.eval.mtp_acceptance import checkpoint_acceptance
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM

    model = Qwen3_5MoeForCausalLM(model_config, dtype=sampler.dtype, moe_impl=sampler.moe_impl,
                                   moe_token_chunk=sampler.moe_token_chunk)
    figures, extra = checkpoint_acceptance(model, sampler.params, sampler.tokenizer, config.world,
                                           items=config.mtp_items, max_len=seq_len,
                                           batch_size=1, bucket=config.bucket,
                                           pad_id=model_config.pad_token_id or 0,
                                           vocab_chunk=config.mtp_vocab_chunk)
    log.info("eval mtp: depth-1 acceptance %.4f, mean accepted length %.4f (%d positions, %d episodes, %.1f s)",
             figures["acceptance_depth1"], figures["mean_accepted_length"], figures["positions"],
             figures["episodes"], extra["wall_s"])
    return figures, extra


def evaluate(sampler: Sampler, config: EvalConfig, *, out_dir: str | Path | None = None,
             progress: bool = True) -> dict:
    """Scores a policy on every suite of `config` (module docstring).

    Args:
      sampler: the policy (`EvalConfig.sampler` builds the JAX one with the config's compute dtype and bucket);
        its tokenizer has the Qwen chat template, eos `<|im_end|>`.
      config: EvalConfig. out_dir: where to write per-item / per-prompt JSONL and scores.json (None: nothing).
      progress: tqdm bars per suite.
    Returns:
      the results dict of the module docstring (metrics on 0-100).
    Raises:
      TypeError: config is not an EvalConfig.
      ValueError: a prompt of a live item that does not fit seq_len (names the task); an IFEval file that is
        not the official one; no live_qa oracle episode with a generated token within seq_len (mtp, raised
        before any suite runs). FileNotFoundError: a given IFEval file is missing. ImportError: the IFEval
        checker packages are missing.
    """
    if not isinstance(config, EvalConfig):
        raise TypeError(f"config: expected an EvalConfig, got {type(config).__name__}")
    t_start = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else None
    positions = sampler.model_config.max_position_embeddings
    seq_len = min(config.seq_len, positions - config.max_new_tokens)
    if seq_len != config.seq_len:
        log.info("eval: seq_len %d lowered to %d (max_position_embeddings %d - max_new_tokens %d)", config.seq_len,
                 seq_len, positions, config.max_new_tokens)
    mtp = _mtp_acceptance(sampler, config, seq_len)   # first: a failure here costs seconds, not the suites' time
    results, extra = _live_suites(sampler, config, seq_len, out, progress)
    extra = {"seq_len": float(seq_len), **extra}
    instruction, instruction_extra = _instruction_suites(sampler, config, out, progress)
    results.update(instruction)
    extra.update(instruction_extra)
    results["mtp"], extra["mtp"] = mtp
    extra["wall_s"] = time.perf_counter() - t_start
    results["extra"] = extra
    if out is not None:
        (out / "scores.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return results


def evaluate_checkpoint(ckpt: str | Path, config: EvalConfig, **kw) -> dict:
    """`evaluate` on a checkpoint: a stage run dir or a model checkpoint, with `tokenizer/` in it or its parent,
    sampled by `hat_jax.rollout.load_sampler` in the config's compute dtype with its bucket.

    Args:
      ckpt: the checkpoint directory (`hat_jax.model.checkpoint_io` layouts). config: EvalConfig.
      **kw: passed to `evaluate` (out_dir, progress).
    Raises:
      FileNotFoundError: no checkpoint or no tokenizer folder (names the paths looked at).
      ValueError: unreadable params, or a tokenizer larger than the model's vocabulary.
    """
    return evaluate(load_sampler(ckpt, config.compute_dtype, bucket=config.bucket), config, **kw)
