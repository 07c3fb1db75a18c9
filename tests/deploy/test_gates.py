"""`python -m hat_jax.deploy.gates` on hand-made replay and results JSONs with known pass/fail."""

from __future__ import annotations

import json
import re

import pytest

from hat_jax.deploy import gates
from hat_jax.deploy.replay_stats import nearest_rank, summarize

VERSIONS = {"policy": {"version": "hat@step120", "source": "hf/hat_export.json"},
            "harness": {"name": "production", "version": "2026.11.0", "sha256": "ab" * 32}}


def _replay(p95=(8.1, 9.0), within=(1.0, 1.0)) -> dict:
    levels = [{"concurrency": c, "summary": {"p50_wall_s": 3.4, "p95_wall_s": p, "within_15s": w}}
              for c, p, w in zip((1, 2), p95, within)]  # fmt: skip
    return {"kind": "hat-jax deployment replay", "versions": VERSIONS, "levels": levels}


def _results(live_avg=94.8, ife=83.5, mini=70.0) -> dict:
    ifeval = None if ife is None else {"prompt_strict": ife, "inst_strict": 88.7, "prompt_loose": 85, "inst_loose": 90}
    return {"experiment": "x", "metrics": {"live_qa": {"acc": 95.8, "eff": 93.8, "avg": live_avg}, "ifeval": ifeval,
                                           "ifeval_mini": {"prompt_strict": mini, "inst_strict": 80}}}


def _run(tmp_path, capsys, replay, cand, base, config=None, extra=()):
    paths = {}
    for name, data in (("replay", replay), ("eval", cand), ("baseline", base)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    argv = ["--replay", str(paths["replay"]), "--eval", str(paths["eval"]), "--baseline", str(paths["baseline"])]
    if config is not None:
        (tmp_path / "gates.yaml").write_text(config)
        argv += ["--config", str(tmp_path / "gates.yaml")]
    code = gates.main(argv + list(extra))
    out, err = capsys.readouterr()
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in out.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in ("latency", "business", "general")}  # fmt: skip
    return code, rows, out, err


def test_all_gates_pass_and_versions_are_printed(tmp_path, capsys):
    code, rows, out, _ = _run(tmp_path, capsys, _replay(), _results(), _results(live_avg=94.0, ife=81.5),
                              extra=["--json", str(tmp_path / "g.json")])  # fmt: skip
    assert code == 0 and rows == {"latency": "PASS", "business": "PASS", "general": "PASS"}
    assert "policy version: hat@step120" in out and "production 2026.11.0" in out and "IFE-P 83.50" in out
    saved = json.loads((tmp_path / "g.json").read_text())
    assert saved["passed"] is True and saved["versions"] == VERSIONS


@pytest.mark.parametrize(
    "replay, cand, base, expected",
    [
        (_replay(p95=(8.1, 15.2)), _results(), _results(), {"latency": "FAIL"}),  # C=2 P95 above 15 s
        (_replay(within=(0.98, 1.0)), _results(), _results(), {"latency": "FAIL"}),  # 98% < 99% within 15 s
        (_replay(p95=(15.0, 15.0), within=(0.99, 0.99)), _results(), _results(), {}),  # both thresholds are inclusive
        (_replay(), _results(live_avg=93.8), _results(live_avg=94.8), {}),  # exactly baseline - 1.0
        (_replay(), _results(live_avg=93.79), _results(live_avg=94.8), {"business": "FAIL"}),
        (_replay(), _results(ife=82.4), _results(ife=83.5), {"general": "FAIL"}),
        # IFEval missing on one side: the in-domain gauge decides (70.0 vs 72.0 fails, whatever IFE-P says)
        (_replay(), _results(ife=None, mini=70.0), _results(ife=50.0, mini=72.0), {"general": "FAIL"}),
        (_replay(), _results(ife=None, mini=71.0), _results(ife=99.0, mini=72.0), {}),
    ],
)
def test_gate_outcomes(tmp_path, capsys, replay, cand, base, expected):
    code, rows, out, _ = _run(tmp_path, capsys, replay, cand, base)
    assert rows == {"latency": "PASS", "business": "PASS", "general": "PASS", **expected}
    assert code == (1 if expected else 0)
    assert ("release: blocked" in out) == bool(expected)


def test_config_overrides_thresholds(tmp_path, capsys):
    config = "latency:\n  p95_max_s: 9.0\n  concurrency: [1]\nbusiness:\n  tolerance: 0\n"
    code, rows, _, _ = _run(tmp_path, capsys, _replay(p95=(8.1, 20.0)), _results(live_avg=94.0),
                            _results(live_avg=94.0), config)  # fmt: skip
    assert code == 0 and set(rows.values()) == {"PASS"}  # C=2 is not gated any more


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r, c, b: c["metrics"]["live_qa"].pop("avg"), "--eval .*missing field 'metrics.live_qa.avg'"),
        (lambda r, c, b: b["metrics"].update(ifeval=None, ifeval_mini=None), "--baseline .*'metrics.ifeval_mini' is null"),
        (lambda r, c, b: r["levels"].pop(1), "--replay .*no concurrency level 2"),
        (lambda r, c, b: r.pop("versions"), "--replay .*'versions'"),
        (lambda r, c, b: c["metrics"]["live_qa"].update(avg="94"), "'metrics.live_qa.avg' = '94'; expected a number"),
    ],
)
def test_bad_inputs_exit_2_naming_file_and_field(tmp_path, capsys, mutate, message):
    replay, cand, base = _replay(), _results(), _results()
    mutate(replay, cand, base)
    code, _, _, err = _run(tmp_path, capsys, replay, cand, base)
    assert code == 2
    assert re.search(message, err), err


@pytest.mark.parametrize(
    "config, message",
    [
        ("latency:\n  p95_max: 9\n", "latency.p95_max: unknown key"),
        ("speed:\n  x: 1\n", "unknown section 'speed'"),
        ("business:\n  tolerance: high\n", "business.tolerance = 'high': expected a number"),
        ("latency:\n  concurrency: []\n", "expected a non-empty list of ints"),
        ("- a list\n", "expected a mapping of sections"),
    ],
)
def test_bad_config_exits_2(tmp_path, capsys, config, message):
    code, _, _, err = _run(tmp_path, capsys, _replay(), _results(), _results(), config)
    assert code == 2 and message in err


def test_missing_file_exits_2(tmp_path, capsys):
    code = gates.main(["--replay", str(tmp_path / "nope.json"), "--eval", "x", "--baseline", "y"])
    assert code == 2 and "--replay" in capsys.readouterr().err


def test_nearest_rank_and_summary_by_hand():
    assert nearest_rank([], 0.5) is None
    assert nearest_rank([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0 and nearest_rank(list(range(1, 101)), 0.95) == 95
    recs = [
        {"wall_s": 1.0, "ttft_token_s": 0.1, "ttft_reply_s": 0.5, "success": True, "outcome": "replied", "failure": None,
         "decode_tokens": 9, "decode_s": 0.1, "completion_tokens": 10, "rounds": 2},
        {"wall_s": 16.0, "ttft_token_s": 0.2, "ttft_reply_s": 9.0, "success": True, "outcome": "replied", "failure": None,
         "decode_tokens": 9, "decode_s": 0.2, "completion_tokens": 10, "rounds": 1},
        {"wall_s": 0.2, "ttft_token_s": None, "ttft_reply_s": None, "success": False, "outcome": "fallback_reply",
         "failure": "llm_connect_error", "decode_tokens": 0, "decode_s": 0.0, "completion_tokens": 0, "rounds": 0},
    ]  # fmt: skip
    s = summarize(recs)
    assert (s["n"], s["n_success"], s["success_rate"]) == (3, 2, 0.6667)
    assert s["within_15s"] == 0.3333  # the failed fast request does not count as within 15 s
    assert (s["p50_wall_s"], s["p95_wall_s"]) == (1.0, 16.0)
    assert (s["p50_ttft_token_s"], s["p95_ttft_token_s"], s["n_ttft_token"]) == (0.1, 0.2, 2)
    assert s["decode_tok_s"] == 60.0 and s["completion_tokens"] == 20 and s["mean_rounds"] == 1.0
    assert s["outcomes"] == {"fallback_reply": 1, "replied": 2} and s["failures"] == {"llm_connect_error": 1}
