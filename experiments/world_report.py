"""The live-stream world in figures: sizes, the noisy oracle's rejection rate, HSA transform shares,
judge agreement with the hand labels, and the MCP tool round trip on loopback. A script that prints
figures (not a test); it also builds (or reads) the cached SFT records, RL tasks and eval items.

    .venv/bin/python experiments/world_report.py [--sft-tasks 2000] [--eval-items 200] [--mcp-calls 200]
        [--json OUT]

Figures:
- world: products, categories, SKUs, intents, viewer-message templates; tools and skills of the
  production harness.
- rejection sampling: `hat_jax.data.world_data.sft_records` (noisy oracle `DEFAULT_NOISE`, faults
  5% error / 3% timeout / 2% empty, keep = Accuracy 1 and Effectiveness 1, 2 attempts per task);
  the build time in seconds, or "read from the cache" when the records were cached by an earlier run
  (the rates are those stored with the cached records).
- HSA: share of records each transform touched in one sampled epoch of the SFT pipeline's HSA step
  (default `HSAConfig`, `p_hsa` 0.5, no oracle re-roll).
- judges: agreement and Cohen's kappa with the 64 hand-labelled episodes (`hat_jax/judges/hand_labels.yaml`).
- MCP: p50/p95 client-side latency of sequential `tools/call` round trips to
  `python -m hat_jax.sim.mcp_server` (production harness) over stdio and streamable HTTP.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import subprocess
import sys
import time

from hat_jax.cli_types import positive_int
from hat_jax.data import suites, world_data
from hat_jax.data.pipeline import SFTDataConfig, transform_shares
from hat_jax.judges.agreement import judge_agreement
from hat_jax.sim.mcp_client import SyncToolClient, measure_roundtrip, server_command
from hat_jax.sim.types import INTENTS
from hat_jax.sim.viewers import TEMPLATES
from hat_jax.sim.world_harness import harness_dir, world_harness


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mcp_latency(n: int, harness: str = "production") -> dict[str, dict[str, float]]:
    """p50/p95 ms of `n` round trips over stdio and over streamable HTTP to the MCP server of `harness`."""
    out = {}
    with SyncToolClient(server_command(str(harness_dir(harness)))) as client:
        out["stdio"] = measure_roundtrip(client, n=n)
    port = _free_port()
    server = subprocess.Popen(
        [*server_command(str(harness_dir(harness))), "--transport", "http", "--port", str(port)], stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        with SyncToolClient(url=f"http://127.0.0.1:{port}/mcp") as client:
            out["http"] = measure_roundtrip(client, n=n)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft-tasks", type=positive_int, default=2000)
    parser.add_argument("--eval-items", type=positive_int, default=200)
    parser.add_argument("--mcp-calls", type=positive_int, default=200)
    parser.add_argument("--harness", default="production",
                        help="the world's harness (a shipped name such as production or compact, or a folder)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        config = world_data.WorldDataConfig(sft_tasks=args.sft_tasks, eval_items=args.eval_items, harness=args.harness)
    except ValueError as err:
        parser.error(f"--harness: {err}")
    world, harness = world_data.world_for(config.world_seed, config.n_products), world_harness(config.harness)
    report: dict = {
        "world": {
            "products": len(world.products),
            "categories": len(world.categories),
            "skus": sum(len(p.skus) for p in world.products),
            "intents": len(INTENTS),
            "message_templates": sum(len(t) for t in TEMPLATES.values()),
            "tools": len(harness.tools),
            "skills": len(harness.skills),
            "hooks": len(harness.hooks),
        }
    }
    t0 = time.perf_counter()
    records, meta = world_data.sft_records(config)
    stats = meta["stats"]
    report["rejection_sampling"] = {
        k: stats[k] for k in ("n_tasks", "n_attempts", "n_kept", "rejection_rate", "first_attempt_rejection_rate")
    } | {
        "reject_reasons": stats["reject_reasons"],
        "from_cache": meta["from_cache"],
        "seconds": None if meta["from_cache"] else round(time.perf_counter() - t0, 2),
    }
    report["rl_tasks"] = len(world_data.rl_tasks(config))
    report["eval_items"] = {s: len(world_data.eval_items(s, config)) for s in suites.SUITES}
    report["hsa_transform_shares"] = transform_shares(records, {config.harness: harness}, SFTDataConfig())
    report["judge_agreement"] = {
        m: {k: v for k, v in a.items() if k != "disagree"} for m, a in judge_agreement().items()
    }
    report["mcp_roundtrip_ms"] = mcp_latency(args.mcp_calls, config.harness)

    w, r = report["world"], report["rejection_sampling"]
    print(f"world: {w['products']} products in {w['categories']} categories, {w['skus']} SKUs; "
          f"{w['intents']} intents, {w['message_templates']} message templates; "
          f"{config.harness} harness: {w['tools']} tools, {w['skills']} skills, {w['hooks']} hooks")
    print(f"rejection sampling: {r['n_tasks']} tasks, {r['n_attempts']} rollouts, {r['n_kept']} kept; "
          f"rejection rate {r['rejection_rate']:.1%} (first attempt {r['first_attempt_rejection_rate']:.1%}); "
          f"reasons {r['reject_reasons']}; "
          + ("records read from the cache" if r["from_cache"] else f"built in {r['seconds']} s"))
    print(f"RL tasks: {report['rl_tasks']}; eval items: {report['eval_items']}")
    print("HSA transform shares (one epoch): " + ", ".join(f"{k} {v:.3f}" for k, v in report["hsa_transform_shares"].items()))
    print("judge agreement with hand labels:")
    for m, a in report["judge_agreement"].items():
        print(f"  {m:17s} {a['agree']:3d}/{a['n']:<3d} {a['percent']:6.2f}%  kappa {a['kappa']:.3f}")
    for transport, lat in report["mcp_roundtrip_ms"].items():
        print(f"MCP round trip ({transport}, {args.mcp_calls} calls): p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, ensure_ascii=False, indent=1, default=lambda o: dataclasses.asdict(o))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
