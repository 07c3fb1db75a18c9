"""Per-concurrency figures of a latency replay and its Markdown table in the layout of the paper's Table 7.

Variant implemented and why:
- percentiles are nearest-rank (the ceil(q * n)-th smallest value, as `hat_jax.sim.mcp_client`
  uses): every reported figure is a latency some request really had, and P50 <= P95 always;
- wall latency and the rates are over *all* measured requests (warm-up excluded), failures
  included, as the paper's "15 s rate over all requests": `within_15s` counts a request only if it
  succeeded within 15 s, so a server that fails fast cannot pass the latency gate on speed;
- TTFT percentiles are over the requests that have one ("first token": first generated token of
  any kind; "first reply content": first character of the published model reply), with their counts;
- decode tokens/s is per stream, as the paper's (it falls with concurrency): the tokens after each
  turn's first, summed over the measured requests, divided by the summed time they took.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

LATENCY_LIMIT_S = 15.0


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank q-quantile (q in (0, 1]) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarize(records: Sequence[Mapping[str, Any]], limit_s: float = LATENCY_LIMIT_S) -> dict[str, Any]:
    """Figures of one concurrency level from its measured request records (`AgentResult.to_dict()`).

    Returns:
      {"n", "n_success", "success_rate", "within_15s", "p50_wall_s", "p95_wall_s",
       "p50_ttft_token_s", "p95_ttft_token_s", "n_ttft_token", "p50_ttft_reply_s", "p95_ttft_reply_s",
       "n_ttft_reply", "decode_tok_s", "completion_tokens", "mean_rounds", "outcomes", "failures"};
      rates in [0, 1], seconds rounded to milliseconds, None where there is nothing to measure.
    """
    n = len(records)
    walls = [float(r["wall_s"]) for r in records]
    token = [float(r["ttft_token_s"]) for r in records if r.get("ttft_token_s") is not None]
    reply = [float(r["ttft_reply_s"]) for r in records if r.get("ttft_reply_s") is not None]
    ok = [r for r in records if r["success"]]
    decode_tokens = sum(int(r.get("decode_tokens", 0)) for r in records)
    decode_s = sum(float(r.get("decode_s", 0.0)) for r in records)
    return {
        "n": n,
        "n_success": len(ok),
        "success_rate": _round(len(ok) / n, 4) if n else None,
        "within_15s": _round(sum(1 for r in ok if float(r["wall_s"]) <= limit_s) / n, 4) if n else None,
        "p50_wall_s": _round(nearest_rank(walls, 0.50)),
        "p95_wall_s": _round(nearest_rank(walls, 0.95)),
        "p50_ttft_token_s": _round(nearest_rank(token, 0.50)),
        "p95_ttft_token_s": _round(nearest_rank(token, 0.95)),
        "n_ttft_token": len(token),
        "p50_ttft_reply_s": _round(nearest_rank(reply, 0.50)),
        "p95_ttft_reply_s": _round(nearest_rank(reply, 0.95)),
        "n_ttft_reply": len(reply),
        "decode_tok_s": _round(decode_tokens / decode_s, 2) if decode_s > 0 else None,
        "completion_tokens": sum(int(r.get("completion_tokens", 0)) for r in records),
        "mean_rounds": _round(sum(int(r.get("rounds", 0)) for r in records) / n, 3) if n else None,
        "outcomes": dict(sorted(Counter(r["outcome"] for r in records).items())),
        "failures": dict(sorted(Counter(r["failure"] for r in records if r.get("failure")).items())),
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def report_markdown(report: Mapping[str, Any]) -> str:
    """The replay report as Markdown: versions, setup, then one Table 7 row per concurrency level."""
    v, cfg, srv = report["versions"], report["config"], report["server"]
    h = v["harness"]
    lines = [
        "# Deployment replay (Table 7 layout)",
        "",
        f"- policy version: `{v['policy']['version']}` (from {v['policy']['source']})",
        f"- harness version: `{h['name']} {h['version']}` (content sha256 `{h['sha256'][:16]}`)",
        f"- server: {srv['base_url']} model `{srv['model']}` (preflight: {srv['preflight']})",
        f"- requests: {cfg['n']} from the {cfg['suite']} suite (seed {cfg['seed']}), first {cfg['warmup']} of each "
        f"level are warm-up; temperature {cfg['temperature']}, top-p {cfg['top_p']}, max_tokens {cfg['max_tokens']}",
        f"- fallbacks: first tool call {cfg['agent']['first_tool_timeout_s']} s, later {cfg['agent']['tool_timeout_s']} s, "
        f"trajectory {cfg['agent']['trajectory_budget_s']} s, at most {cfg['agent']['max_tool_rounds']} rounds, "
        f"on failure: {cfg['agent']['on_failure']}",
        "",
        "| setting | P50 s | P95 s | TTFT P50 / P95 s (first token) | TTFT P50 / P95 s (first reply content) "
        "| ≤15 s | success | decode tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for level in report["levels"]:
        s = level["summary"]
        lines.append(
            f"| C={level['concurrency']} | {_s(s['p50_wall_s'])} | {_s(s['p95_wall_s'])} "
            f"| {_s(s['p50_ttft_token_s'])} / {_s(s['p95_ttft_token_s'])} (n={s['n_ttft_token']}) "
            f"| {_s(s['p50_ttft_reply_s'])} / {_s(s['p95_ttft_reply_s'])} (n={s['n_ttft_reply']}) "
            f"| {_pct(s['within_15s'])} | {_pct(s['success_rate'])} "
            f"| {_rate(s['decode_tok_s'])} |"
        )
    lines += ["", "Outcomes and failures of the measured requests:", ""]
    for level in report["levels"]:
        s = level["summary"]
        fails = ", ".join(f"{k} {c}" for k, c in s["failures"].items()) or "none"
        outs = ", ".join(f"{k} {c}" for k, c in s["outcomes"].items())
        lines.append(f"- C={level['concurrency']}: {s['n']} requests; {outs}; failures: {fails}")
    lines += [
        "",
        "Wall latency: viewer message to final answer. First token: first generated token of any kind "
        "(reasoning, content or tool call). First reply content: first character of the published model reply. "
        "≤15 s: requests that succeeded within 15 s, over all measured requests. Success: the agent request "
        "completed without a failure (not: the answer is correct). Decode tok/s: per stream.",
        "",
    ]
    return "\n".join(lines)
