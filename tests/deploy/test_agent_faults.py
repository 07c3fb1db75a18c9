"""The agent loop and the replay against a scripted chat server and the real MCP tool server.

Happy paths (tool call as text or server-parsed, hooks as in the simulator) and every fault the
loop must survive: server down at start, server dying mid-run, a malformed or stalled stream, a tool timing out,
a wrong URL or model name, a malformed harness. Each request is recorded as failed or fallen back,
the replay finishes and writes its report, nothing raises.
"""

from __future__ import annotations

import json
import shutil

import pytest
from fake_chat_server import REPLY, FakeChatServer
from local_servers import free_port

from hat_jax.deploy import replay
from hat_jax.deploy.agent import CONSERVATIVE_REPLY, AgentConfig, run_agent
from hat_jax.deploy.chat_stream import ChatStreamClient, EndpointError
from hat_jax.deploy.replay import ReplayConfig, replay_requests, run_replay
from hat_jax.harness.hooks import HookContext, claims_human, run_hooks
from hat_jax.harness.loader import HarnessError
from hat_jax.judges.phrases import is_conservative
from hat_jax.sim.mcp_client import SyncToolClient, ToolCallOutcome, server_command
from hat_jax.sim.world_harness import PRODUCTION_DIR, production_harness



@pytest.fixture(scope="module")
def task():
    """The first Live QA request of the replay draw."""
    return replay_requests(1, 0)[0][1]


def _replay(tmp_path, server: FakeChatServer | str, tools, n=3, agent=AgentConfig(), **kw) -> dict:
    base_url = server if isinstance(server, str) else server.base_url
    cfg = ReplayConfig(base_url=base_url, model="fake-model", n=n, warmup=0, concurrency=(1,), out=str(tmp_path),
                       agent=agent, **kw)
    report = run_replay(cfg, tools=tools, progress=False)
    assert json.loads((tmp_path / "replay.json").read_text()) == report
    assert "| C=1 |" in (tmp_path / "replay.md").read_text()
    return report


def _records(report) -> list[dict]:
    (level,) = report["levels"]
    assert len(level["requests"]) == level["summary"]["n"]
    return level["requests"]


@pytest.mark.parametrize("mode", ["text_tool", "server_tool"])
def test_tool_round_then_reply_succeeds(mode, tool_client, task):
    with FakeChatServer(mode) as server, ChatStreamClient(server.base_url, "fake-model") as llm:
        rec = run_agent(task, production_harness(), llm, tool_client)
    assert (rec.success, rec.outcome, rec.failure, rec.reply) == (True, "replied", None, REPLY)
    assert rec.rounds == 1 and rec.model_turns == 2
    assert [c["name"] for c in rec.tool_calls] == ["search_products"] and rec.tool_calls[0]["status"] == "ok"
    assert rec.tool_calls[0]["timeout_s"] <= 3.0
    assert 0 < rec.ttft_token_s < rec.ttft_reply_s <= rec.wall_s
    assert rec.completion_tokens == (30 if mode == "text_tool" else 12) + 9  # from `usage`


def test_stop_hook_blocks_twice_so_no_public_reply(tool_client, task):
    with FakeChatServer("human_claim") as server, ChatStreamClient(server.base_url, "fake-model") as llm:
        rec = run_agent(task, production_harness(), llm, tool_client)
    # the harness withheld the reply after one revision: a completed request, not a failure
    assert (rec.success, rec.outcome, rec.failure, rec.reply, rec.env_outcome) == (True, "no_reply", None, "", "no_reply")
    assert rec.model_turns == 2 and rec.ttft_reply_s is None


def test_an_empty_stream_is_a_failure_of_its_own_kind(tmp_path, tool_client, task):
    """Role chunk, `{}` with finish "stop", `[DONE]`: not a success, unlike the Stop-hook-withheld reply above; the
    success rate, the 15 s share and the latency gate count it."""
    from hat_jax.deploy.gates import latency_gate, load_config

    with FakeChatServer("empty") as server, ChatStreamClient(server.base_url, "fake-model") as llm:
        rec = run_agent(task, production_harness(), llm, tool_client)
    assert (rec.success, rec.outcome, rec.failure, rec.reply) == (False, "fallback_reply", "empty_turn",
                                                                  CONSERVATIVE_REPLY)
    assert rec.detail == "turn 1: the model stream had no content, no reasoning and no tool call (finish_reason 'stop')"
    with FakeChatServer("empty") as server:
        report = _replay(tmp_path, server, tool_client, n=2)
    summary = report["levels"][0]["summary"]
    assert (summary["success_rate"], summary["within_15s"], summary["failures"]) == (0.0, 0.0, {"empty_turn": 2})
    gate = latency_gate(report, dict(load_config()["latency"], concurrency=[1]))
    assert gate["passed"] is False and "≤15 s 0.0%" in gate["measured"]


def test_conservative_reply_passes_the_stop_hooks_and_reads_as_conservative():
    h = production_harness()
    decisions = run_hooks(h, "Stop", HookContext("Stop", h, reply=CONSERVATIVE_REPLY))
    assert all(d.action == "continue" for d in decisions)
    assert is_conservative(CONSERVATIVE_REPLY) and not claims_human(CONSERVATIVE_REPLY)


def test_server_down_at_start_every_request_fails_fast_and_is_reported(tmp_path, mcp_url, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    code = replay.main(["--base-url", url, "--model", "fake-model", "--n", "3", "--warmup", "0", "--concurrency", "1",
                        "--mcp-url", mcp_url, "--out", str(tmp_path), "--no-progress"])
    assert code == 1  # a report, but nothing succeeded
    report = json.loads((tmp_path / "replay.json").read_text())
    assert report["server"]["preflight"].startswith("unreachable")
    recs = _records(report)
    expected = ("llm_connect_error", "fallback_reply", CONSERVATIVE_REPLY)
    assert [(r["failure"], r["outcome"], r["reply"]) for r in recs] == [expected] * 3
    assert report["levels"][0]["summary"]["success_rate"] == 0 and report["levels"][0]["summary"]["within_15s"] == 0
    assert "| C=1 |" in capsys.readouterr().out


def test_server_dies_mid_run(tmp_path, tool_client):
    with FakeChatServer("die_after", die_after=2) as server:
        report = _replay(tmp_path, server, tool_client, n=5)
    recs = _records(report)
    assert [r["failure"] for r in recs] == [None, None, "llm_broken", "llm_connect_error", "llm_connect_error"]
    assert [r["outcome"] for r in recs] == ["replied"] * 2 + ["fallback_reply"] * 3
    s = report["levels"][0]["summary"]
    assert (s["n_success"], s["success_rate"], s["failures"]) == (2, 0.4, {"llm_broken": 1, "llm_connect_error": 2})


def test_malformed_stream(tmp_path, tool_client):
    with FakeChatServer("malformed") as server:
        recs = _records(_replay(tmp_path, server, tool_client, n=2))
    assert {(r["failure"], r["outcome"]) for r in recs} == {("llm_malformed", "fallback_reply")}
    assert "not JSON" in recs[0]["detail"]


def test_stalled_stream_with_the_silent_fallback(tmp_path, tool_client):
    agent = AgentConfig(on_failure="silent")
    with FakeChatServer("stall", stall_s=3.0) as server:
        recs = _records(_replay(tmp_path, server, tool_client, n=2, agent=agent, stall_timeout_s=0.4))
    assert {(r["failure"], r["outcome"], r["reply"]) for r in recs} == {("llm_stalled", "no_reply", "")}
    assert all(0.4 <= r["wall_s"] < 2.5 for r in recs)


def test_stall_past_the_trajectory_budget_is_budget_exhausted(tool_client, task):
    with FakeChatServer("stall", stall_s=3.0) as server, ChatStreamClient(server.base_url, "fake-model") as llm:
        rec = run_agent(task, production_harness(), llm, tool_client, AgentConfig(trajectory_budget_s=0.5))
    assert (rec.failure, rec.outcome) == ("budget_exhausted", "fallback_reply") and 0.5 <= rec.wall_s < 2.0


def test_tool_timeouts_fall_back(tmp_path):
    agent = AgentConfig(first_tool_timeout_s=0.3, tool_timeout_s=0.2)
    slow = server_command(PRODUCTION_DIR, 0, "--tool-delay-s", "1.0")
    with (open(tmp_path / "mcp.log", "w") as log, FakeChatServer("always_tool") as server,
          SyncToolClient(slow, errlog=log) as tools):
        recs = _records(_replay(tmp_path, server, tools, n=2, agent=agent))
    for r in recs:
        assert r["failure"] == "round_limit" and r["outcome"] == "fallback_reply" and r["rounds"] == 4
        assert [c["status"] for c in r["tool_calls"]] == ["timeout"] * 4 and r["tool_failures"] == 4
        assert [c["timeout_s"] for c in r["tool_calls"]] == [0.3, 0.2, 0.2, 0.2]
        assert all(c["latency_s"] < 0.9 for c in r["tool_calls"])


class _GoneToolServer:
    """A tool client whose session has ended (what `ToolClient` answers once the server exited)."""

    def call_tool(self, name, arguments, timeout_s):
        return ToolCallOutcome("transport_error", {"error": "session ended: server exited"}, 0.0, "transport_error")


def test_tool_server_gone_falls_back(task):
    with FakeChatServer("always_tool") as server, ChatStreamClient(server.base_url, "fake-model") as llm:
        rec = run_agent(task, production_harness(), llm, _GoneToolServer())
    assert (rec.failure, rec.outcome, rec.model_turns) == ("tool_server_down", "fallback_reply", 1)
    assert "server exited" in rec.detail


@pytest.mark.parametrize("case", ["wrong_model", "wrong_url"])
def test_wrong_model_or_url_fails_fast_with_status_and_body(case, tmp_path, mcp_url, capsys):
    with FakeChatServer("reply") as server:
        url = server.base_url if case == "wrong_model" else server.base_url.removesuffix("/v1")
        model = "no-such-model" if case == "wrong_model" else "fake-model"
        with pytest.raises(EndpointError) as err, ChatStreamClient(url, model) as llm:
            llm.check_endpoint()
        code = replay.main(["--base-url", url, "--model", model, "--n", "2", "--warmup", "0", "--mcp-url", mcp_url,
                            "--out", str(tmp_path / "out"), "--no-progress"])
        assert server.posts == 0
    assert err.value.status == (400 if case == "wrong_model" else 404)
    stderr = capsys.readouterr().err
    assert code == 2 and f"HTTP {err.value.status}" in stderr
    assert ("is not served here" if case == "wrong_model" else "Not Found") in stderr
    assert not (tmp_path / "out" / "replay.json").exists()


def test_malformed_harness_is_rejected_before_any_request(tmp_path, tool_client):
    bad = tmp_path / "harness"
    shutil.copytree(PRODUCTION_DIR, bad)
    manifest = bad / "harness.yaml"
    manifest.write_text(manifest.read_text().replace("skill_tool: load_skill", "skill_tool: no_such_tool"))
    with FakeChatServer("reply") as server:
        with pytest.raises(HarnessError, match="skill_tool"):
            _replay(tmp_path / "out", server, tool_client, harness=str(bad))
        assert server.posts == 0
    assert not (tmp_path / "out").exists()


def test_report_records_policy_and_harness_versions(tmp_path, tool_client):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "hat_export.json").write_text(json.dumps({"policy_version": "table3_hat/seed0@step120", "dtype": "bfloat16"}))
    with FakeChatServer("reply") as server:
        report = _replay(tmp_path / "out", server, tool_client, n=2, hf_dir=str(hf))
    policy, harness = report["versions"]["policy"], report["versions"]["harness"]
    assert policy["version"] == "table3_hat/seed0@step120" and policy["export"] == {"dtype": "bfloat16"}
    assert harness["version"] == production_harness().version and len(harness["sha256"]) == 64
    md = (tmp_path / "out" / "replay.md").read_text()
    assert "table3_hat/seed0@step120" in md and harness["sha256"][:16] in md
    (hf / "hat_export.json").write_text(json.dumps({"policy_version": 3}))
    with pytest.raises(ValueError, match="policy_version"):
        _replay(tmp_path / "out2", "http://127.0.0.1:9/v1", tool_client, hf_dir=str(hf))
