"""The deployment latency replay (the paper's Table 7): Live QA requests through the full agent loop.

    python -m hat_jax.deploy.replay --base-url http://127.0.0.1:8000/v1 --model MODEL \\
        [--n 110 --warmup 10] [--concurrency 1 2 4 8] [--harness DIR_OR_YAML] [--out runs/replay] [--seed 0] \\
        [--hf-dir HF_DIR] [--mcp-url http://127.0.0.1:8765/mcp] [--max-tokens N]

Variant implemented and why:
- requests: `--n` Live QA items (`hat_jax.data.world_data.eval_items("live_qa")`, the evaluation's
  own held-out items, 200 by default or `--n` if more) drawn with `random.Random(--seed)`; every
  concurrency level replays the same requests in the same order, the first `--warmup` of each level
  unmeasured (the paper: 110 requests, 10 warm-up);
- each request is one `hat_jax.deploy.agent.run_agent` (harness, streamed model turns, MCP tools,
  hooks, fallbacks). Concurrency C is a closed loop: C worker threads, each taking the next request
  when its previous one ends. Tools come from `--mcp-url` (Streamable HTTP) or, by default, a
  `python -m hat_jax.sim.mcp_server` spawned on stdio with the same harness and the suite's world
  seed (its stderr goes to `OUT/mcp_server.log`);
- before anything is sent the harness is loaded with the loader's full validation, and the
  endpoint is checked (`ChatStreamClient.check_endpoint`): a wrong URL or model name stops the
  replay with the HTTP status and body (exit 2). A server that does not answer at all is recorded
  and the replay runs anyway, every request failing fast, so the report shows it;
- outputs: `OUT/replay.json` (config, versions, per-level summary and every request) and
  `OUT/replay.md` (`replay_stats.report_markdown`, printed too). The policy version (`--hf-dir`'s
  `hat_export.json`, else the model id) and the harness version are recorded separately.
Exit status: 0 with a report, 1 with a report in which no measured request succeeded, 2 on bad input
(options, harness, `--hf-dir`, wrong URL or model, tool server not reachable) with nothing sent.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import random
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hat_jax.cli_types import float_in, positive_int
from hat_jax.data.world_data import WorldDataConfig, eval_items, world_for
from hat_jax.harness.state import HarnessState
from hat_jax.sim.catalog import World
from hat_jax.sim.mcp_client import SyncToolClient, server_command
from hat_jax.sim.types import Task
from hat_jax.sim.world_harness import harness_dir, load_world_harness

from hat_jax.deploy.agent import AgentConfig, AgentResult, ToolCaller, run_agent
from hat_jax.deploy.chat_stream import ChatStreamClient, EndpointError, ServerUnreachable
from hat_jax.deploy.replay_stats import report_markdown, summarize
from hat_jax.deploy.versions import harness_version, policy_version

log = logging.getLogger("hat_jax.deploy.replay")
SUITE = "live_qa"
REPORT_KIND = "hat-jax deployment replay"


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """Everything a replay needs (the CLI flags, see the module docstring).

    Attributes:
      base_url, model, api_key: the OpenAI-compatible endpoint and the served model name.
      n, warmup: requests per concurrency level, the first `warmup` of them unmeasured.
      concurrency: the levels, run in order.
      harness: harness folder or `harness.yaml` (None: the world's harness, `world.harness`).
      out: output folder; seed: request draw; hf_dir: exported folder with `hat_export.json`.
      mcp_url: Streamable HTTP tool server (None: spawn one on stdio).
      max_tokens, temperature, top_p, extra_body: per model turn.
      stall_timeout_s, connect_timeout_s: stream limits; agent: tool timeouts, budget, fallback.
      world: the data config whose Live QA items (and world seed) are replayed.
    """

    base_url: str
    model: str
    n: int = 110
    warmup: int = 10
    concurrency: tuple[int, ...] = (1, 2)
    harness: str | None = None
    out: str = "runs/replay"
    seed: int = 0
    hf_dir: str | None = None
    mcp_url: str | None = None
    api_key: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 0.95
    extra_body: dict = dataclasses.field(default_factory=dict)
    stall_timeout_s: float = 5.0
    connect_timeout_s: float = 5.0
    agent: AgentConfig = AgentConfig()
    world: WorldDataConfig = WorldDataConfig()

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and self.n >= 1):
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if not (isinstance(self.warmup, int) and 0 <= self.warmup < self.n):
            raise ValueError(f"warmup must be an int in [0, n), got {self.warmup!r} with n={self.n}")
        if not self.concurrency or any(not isinstance(c, int) or c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency must be ints >= 1, got {self.concurrency!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


def replay_requests(n: int, seed: int, world: WorldDataConfig = WorldDataConfig()) -> list[tuple[str, Task]]:
    """`n` (item id, task) pairs of the Live QA suite, drawn without replacement with `random.Random(seed)`."""
    items = eval_items(SUITE, dataclasses.replace(world, eval_items=max(world.eval_items, n)))
    picked = random.Random(seed).sample(items, n)
    return [(it.item_id, it.task) for it in picked]


def _one(index: int, item_id: str, task: Task, harness: HarnessState, llm: ChatStreamClient, tools: ToolCaller,
         agent: AgentConfig, world: World | None) -> dict:  # fmt: skip
    try:
        rec = run_agent(task, harness, llm, tools, agent, world=world, request_id=item_id)
    except Exception as exc:  # boundary: a bug in one request must not end the replay
        log.exception("request %s raised", item_id)
        rec = AgentResult(request_id=item_id, intent=task.intent, failure="internal_error",
                          detail=f"{type(exc).__name__}: {exc}", outcome="no_reply")  # fmt: skip
    return {"index": index, **rec.to_dict()}


def run_level(
    requests: Sequence[tuple[str, Task]], concurrency: int, warmup: int, harness: HarnessState,
    llm: ChatStreamClient, tools: ToolCaller, agent: AgentConfig, world: World | None = None, progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Runs every request at one concurrency level (closed loop of `concurrency` threads).

    Returns:
      {"concurrency", "summary" (of the measured requests, `replay_stats.summarize`),
       "requests" (every record in request order, with "index" and "warmup")}.
    """
    records: list[dict] = []
    lock = threading.Lock()
    bar = tqdm(total=len(requests), desc=f"replay C={concurrency}", unit="req", disable=not progress, file=sys.stderr)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"replay-c{concurrency}") as pool:
        futures = [pool.submit(_one, i, item_id, task, harness, llm, tools, agent, world)
                   for i, (item_id, task) in enumerate(requests)]  # fmt: skip
        for future in as_completed(futures):
            rec = future.result()
            with lock:
                records.append(rec)
            bar.set_postfix(ok=sum(r["success"] for r in records), refresh=False)
            bar.update(1)
    bar.close()
    records.sort(key=lambda r: r["index"])
    for r in records:
        r["warmup"] = r["index"] < warmup
    return {"concurrency": concurrency, "summary": summarize([r for r in records if not r["warmup"]]), "requests": records}


def _config_dict(cfg: ReplayConfig, harness_path: str) -> dict[str, Any]:
    return {
        "n": cfg.n, "warmup": cfg.warmup, "concurrency": list(cfg.concurrency), "seed": cfg.seed, "suite": SUITE,
        "world_seed": cfg.world.world_seed, "harness_path": harness_path, "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature, "top_p": cfg.top_p, "extra_body": cfg.extra_body,
        "stall_timeout_s": cfg.stall_timeout_s, "tools": cfg.mcp_url or "stdio: python -m hat_jax.sim.mcp_server",
        "agent": {k: v for k, v in dataclasses.asdict(cfg.agent).items()},
    }  # fmt: skip


def run_replay(cfg: ReplayConfig, *, tools: ToolCaller | None = None, progress: bool = True) -> dict[str, Any]:
    """Runs the replay and writes `replay.json` and `replay.md` under `cfg.out`.

    Args:
      cfg: the replay; tools: an already connected tool client (default: per `cfg.mcp_url` / stdio).
      progress: show a tqdm bar per level on stderr.
    Returns:
      the report (the content of `replay.json`).
    Raises (before any model request is sent):
      HarnessError: a malformed harness (file, field and what was expected).
      FileNotFoundError, ValueError: a bad `hf_dir` (`versions.policy_version`).
      EndpointError: a wrong base URL or model name (HTTP status and body).
      ConnectionError: the tool server cannot be started or reached.
    """
    harness_path = str(cfg.harness or harness_dir(cfg.world.harness))
    harness = load_world_harness(harness_path)
    versions = {"policy": policy_version(cfg.model, cfg.hf_dir), "harness": harness_version(harness)}
    llm = ChatStreamClient(cfg.base_url, cfg.model, api_key=cfg.api_key, temperature=cfg.temperature, top_p=cfg.top_p,
                           max_tokens=cfg.max_tokens, extra_body=cfg.extra_body,
                           connect_timeout_s=cfg.connect_timeout_s, stall_timeout_s=cfg.stall_timeout_s)  # fmt: skip
    out = Path(cfg.out)
    own_tools, errlog = None, None
    try:
        try:
            preflight = llm.check_endpoint()
        except ServerUnreachable as exc:
            preflight = f"unreachable: {exc}"
            log.warning("model server unreachable at start (%s); every request will be recorded as failed", exc)
        requests = replay_requests(cfg.n, cfg.seed, cfg.world)
        world = world_for(cfg.world.world_seed, cfg.world.n_products)
        out.mkdir(parents=True, exist_ok=True)
        if tools is None:
            if cfg.mcp_url:
                own_tools = SyncToolClient(url=cfg.mcp_url)
            else:
                errlog = open(out / "mcp_server.log", "w", encoding="utf-8")  # noqa: SIM115 (lives as long as the server)
                command = server_command(harness_path, cfg.world.world_seed, "--n-products", str(cfg.world.n_products))
                own_tools = SyncToolClient(command, errlog=errlog)
            tools = own_tools
        levels = [run_level(requests, c, cfg.warmup, harness, llm, tools, cfg.agent, world, progress)
                  for c in cfg.concurrency]  # fmt: skip
    finally:
        llm.close()
        if own_tools is not None:
            own_tools.close()
        if errlog is not None:
            errlog.close()
    report = {
        "kind": REPORT_KIND,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions,
        "server": {"base_url": cfg.base_url, "model": cfg.model, "preflight": preflight},
        "config": _config_dict(cfg, harness_path),
        "levels": levels,
    }
    (out / "replay.json").write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (out / "replay.md").write_text(report_markdown(report), encoding="utf-8")
    return report


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); `--help` lists every flag."""
    p = argparse.ArgumentParser(prog="python -m hat_jax.deploy.replay", description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="API root, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--n", type=positive_int, default=110, help="requests per level, warm-up included")
    p.add_argument("--warmup", type=int, default=10, help="unmeasured requests at the start of each level")
    p.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 2])
    p.add_argument("--harness", default=None, help="harness folder or harness.yaml (default: the world's, production)")
    p.add_argument("--out", default="runs/replay")
    p.add_argument("--seed", type=int, default=0, help="seed of the request draw")
    p.add_argument("--hf-dir", default=None, help="exported folder; its hat_export.json gives the policy version")
    p.add_argument("--mcp-url", default=None, help="Streamable HTTP tool server (default: spawn one on stdio)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-tokens", type=positive_int, default=None, help="per model turn")
    p.add_argument("--temperature", type=float_in(0.0, 2.0), default=1.0)
    p.add_argument("--top-p", type=float_in(0.0, 1.0, low_open=True), default=0.95)
    p.add_argument("--extra-body", type=_json_object, default={}, help="JSON merged into every request body")
    p.add_argument("--stall-timeout-s", type=float_in(0.0, low_open=True), default=5.0,
                   help="longest silence inside a stream")
    p.add_argument("--first-tool-timeout-s", type=float_in(0.0, low_open=True), default=3.0)
    p.add_argument("--tool-timeout-s", type=float_in(0.0, low_open=True), default=2.0,
                   help="tool calls after the first")
    p.add_argument("--budget-s", type=float_in(0.0, low_open=True), default=10.0, help="whole-trajectory budget")
    p.add_argument("--max-rounds", type=positive_int, default=4, help="tool rounds")
    p.add_argument("--on-failure", choices=("conservative", "silent"), default="conservative")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (module docstring)."""
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    try:
        agent = AgentConfig(max_tool_rounds=args.max_rounds, first_tool_timeout_s=args.first_tool_timeout_s,
                            tool_timeout_s=args.tool_timeout_s, trajectory_budget_s=args.budget_s,
                            on_failure=args.on_failure)  # fmt: skip
        cfg = ReplayConfig(
            base_url=args.base_url, model=args.model, n=args.n, warmup=args.warmup, concurrency=tuple(args.concurrency),
            harness=args.harness, out=args.out, seed=args.seed, hf_dir=args.hf_dir, mcp_url=args.mcp_url,
            api_key=args.api_key, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
            extra_body=args.extra_body, stall_timeout_s=args.stall_timeout_s, agent=agent,
        )  # fmt: skip
        report = run_replay(cfg, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, EndpointError, ConnectionError) as exc:  # HarnessError is a ValueError
        print(f"replay: error: {exc}", file=sys.stderr)
        return 2
    print(report_markdown(report))
    print(f"wrote {Path(cfg.out) / 'replay.json'} and {Path(cfg.out) / 'replay.md'}", file=sys.stderr)
    return 0 if any(level["summary"]["n_success"] for level in report["levels"]) else 1


if __name__ == "__main__":
    sys.exit(main())
