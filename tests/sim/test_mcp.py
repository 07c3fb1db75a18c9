"""Real MCP client-server sessions: `python -m hat_jax.sim.mcp_server` over stdio and Streamable HTTP.

One server process per fixture (module scope): a plain stdio server, a stdio server whose every call
draws an injected timeout, and one HTTP server owned by its test. Run with `-s` to see the measured
loopback round-trip latency.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from hat_jax.sim import mcp_server
from hat_jax.sim.catalog import World
from hat_jax.sim.executor import execute_tool_call
from hat_jax.sim.mcp_client import SyncToolClient, ToolClient, measure_roundtrip, server_command
from hat_jax.sim.mcp_server import FaultConfig, tool_result
from hat_jax.sim.world_harness import load_world_harness

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = REPO / "hat_jax" / "harnesses" / "production"
SEED = 0
PRODUCT = "P0001"


@pytest.fixture(scope="module")
def harness():
    return load_world_harness(PRODUCTION)


@pytest.fixture(scope="module")
def world():
    return World.generate(seed=SEED)


@pytest.fixture(scope="module")
def errlog(tmp_path_factory):
    with open(tmp_path_factory.mktemp("mcp") / "server_stderr.log", "w") as f:
        yield f


@pytest.fixture(scope="module")
def stdio(errlog):
    with SyncToolClient(server_command(PRODUCTION, SEED), cwd=str(REPO), errlog=errlog) as client:
        yield client


@pytest.fixture(scope="module")
def stdio_timeouts(errlog):
    """Every call to a harness tool draws a "timeout" fault (the server sleeps 30 s)."""
    cmd = server_command(PRODUCTION, SEED, "--fault-timeout", "1.0", "--timeout-fault-s", "30")
    with SyncToolClient(cmd, cwd=str(REPO), errlog=errlog) as client:
        yield client


def surface_args(tool, canonical: dict) -> dict:
    """Canonical arguments placed at the tool's surface paths (`Tool.arg_paths`)."""
    out: dict = {}
    for key, value in canonical.items():
        *parents, leaf = tool.arg_paths[key]
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


# --- pure parts --------------------------------------------------------------------------------


def test_fault_config_names_the_bad_field():
    with pytest.raises(ValueError, match="unknown fault kind 'crash'"):
        FaultConfig(rates={"crash": 0.1})
    with pytest.raises(ValueError, match="sum to"):
        FaultConfig(rates={"error": 0.7, "timeout": 0.7})


def test_tool_result_sets_is_error_for_every_non_ok_status():
    ok = tool_result("ok", {"价格": 9.9}, impl="get_price", canonical_args={"product_id": "P1"})
    assert ok.is_error is False and ok.content[0].text == '{"价格": 9.9}'
    assert ok.structured_content == {"价格": 9.9} and ok.meta["hat-jax/impl"] == "get_price"
    for status in ("error", "timeout", "empty", "invalid_arguments", "unknown_tool"):
        assert tool_result(status, {}).is_error is True


def test_tool_client_needs_exactly_one_target():
    with pytest.raises(ValueError, match="exactly one"):
        ToolClient()
    with pytest.raises(ValueError, match="exactly one"):
        ToolClient(["python"], url="http://127.0.0.1:1/mcp")


# --- command line --------------------------------------------------------------------------------


def test_bad_harness_path_exits_2_with_a_clear_error(tmp_path):
    missing = tmp_path / "no_such_harness"
    proc = subprocess.run(server_command(missing, SEED), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and "expected a shipped harness (compact, production) or the path" in proc.stderr
    assert proc.stdout == ""  # stdout is the transport: nothing else is ever written there


def test_malformed_harness_exits_2_naming_the_file(tmp_path):
    (tmp_path / "harness.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    proc = subprocess.run(server_command(tmp_path, SEED), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "harness.yaml" in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--n-products", "3", "--n-products: expected an integer in [10, 2000], got 3"),
        ("--n-products", "many", "--n-products: expected an integer in [10, 2000], got 'many'"),
        ("--port", "0", "--port: expected an integer in [1, 65535], got 0"),
        ("--port", "70000", "--port: expected an integer in [1, 65535], got 70000"),
    ],
)
def test_out_of_range_options_are_argparse_errors(capsys, option, value, expected):
    with pytest.raises(SystemExit) as info:
        mcp_server.main(["--harness", str(PRODUCTION), "--seed", "0", option, value])
    assert info.value.code == 2 and expected in capsys.readouterr().err


def test_nan_fault_rate_exits_2(capsys):
    assert mcp_server.main(["--harness", str(PRODUCTION), "--seed", "0", "--fault-error", "nan"]) == 2
    assert "FaultConfig.rates['error'] = nan" in capsys.readouterr().err


def test_a_port_in_use_exits_2_with_a_clear_message(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        argv = ["--harness", str(PRODUCTION), "--seed", "0", "--transport", "http", "--port", str(port)]
        assert mcp_server.main(argv) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "in use" in err and "serving" not in err


def test_connecting_to_a_server_that_exits_raises_connection_error(tmp_path, errlog):
    with pytest.raises(ConnectionError, match="cannot connect"):
        SyncToolClient(server_command(tmp_path / "missing", SEED), cwd=str(REPO), errlog=errlog)


# --- stdio session ------------------------------------------------------------------------------


def test_list_tools_equals_the_harness_tools(stdio, harness):
    tools = stdio.list_tools()
    assert tools == [t.mcp_spec() for t in harness.tools]
    for listed, tool in zip(tools, harness.tools):  # property order survives the wire too
        assert list(listed["inputSchema"].get("properties", {})) == list(tool.input_schema.get("properties", {}))


def test_price_lookup_returns_the_catalog_value(stdio, harness, world):
    tool = harness.tool_by_impl("get_price")
    out = stdio.call_tool(tool.name, surface_args(tool, {"product_id": PRODUCT}), timeout_s=3.0)
    assert out.status == "ok" and out.tool_status == "ok"
    assert out.impl == "get_price" and out.canonical_args == {"product_id": PRODUCT}
    assert out.result["live_price"] == world.product(PRODUCT).live_price == 188.9
    # The same call in process gives the same payload the model would see.
    local = execute_tool_call(world, harness, tool.name, surface_args(tool, {"product_id": PRODUCT}))
    assert out.result == local.result
    assert 0 < out.latency_s < 3.0


def test_invalid_arguments_give_an_error_outcome_with_the_structured_error(stdio, harness, world):
    tool = harness.tool_by_impl("get_price")
    out = stdio.call_tool(tool.name, {}, timeout_s=3.0)
    assert out.status == "error" and out.tool_status == "invalid_arguments"
    assert out.result == execute_tool_call(world, harness, tool.name, {}).result
    leaf = tool.arg_paths["product_id"][-1]
    assert out.result["error"]["type"] == "invalid_arguments"
    assert out.result["error"]["details"]["errors"] == [{"path": "(root)", "message": f"'{leaf}' is a required property"}]


def test_an_empty_search_query_is_a_structured_invalid_arguments_error(stdio, harness, world):
    tool = harness.tool_by_impl("search_products")
    out = stdio.call_tool(tool.name, surface_args(tool, {"query": "  "}), timeout_s=3.0)
    assert out.status == "error" and out.tool_status == "invalid_arguments"
    assert out.result == execute_tool_call(world, harness, tool.name, surface_args(tool, {"query": "  "})).result
    assert out.result["error"]["details"]["errors"] == [{"path": "query", "message": "搜索关键词不能为空（query）"}]


def test_unknown_tool_gives_an_error_outcome(stdio, harness):
    out = stdio.call_tool("no_such_tool", {"x": 1}, timeout_s=3.0)
    assert out.status == "error" and out.tool_status == "unknown_tool"
    assert out.result["error"]["details"]["available_tools"] == [t.name for t in harness.tools]


def test_measure_roundtrip_stdio(stdio, harness):
    tool = harness.tool_by_impl("get_price")
    stats = measure_roundtrip(stdio, n=50, name=tool.name, arguments=surface_args(tool, {"product_id": PRODUCT}))
    print(f"\nMCP loopback round trip, stdio: p50 {stats['p50_ms']:.2f} ms, p95 {stats['p95_ms']:.2f} ms")
    assert 0 < stats["p50_ms"] <= stats["p95_ms"]


# --- timeouts -----------------------------------------------------------------------------------


def test_a_tool_timeout_is_an_outcome_within_the_bound(stdio_timeouts, harness):
    tool = harness.tool_by_impl("get_price")
    out = stdio_timeouts.call_tool(tool.name, surface_args(tool, {"product_id": PRODUCT}), timeout_s=0.5)
    assert out.status == "timeout" and "timed out" in out.result["error"]
    assert 0.5 <= out.latency_s < 1.5
    # The server cancelled the sleeping handler and still answers (unknown tools draw no fault).
    assert stdio_timeouts.call_tool("no_such_tool", {}, timeout_s=3.0).tool_status == "unknown_tool"


# --- Streamable HTTP ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"MCP HTTP server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"MCP HTTP server not listening on {port} after {timeout_s} s")


def test_http_session(harness, world, errlog):
    port = free_port()
    cmd = server_command(PRODUCTION, SEED, "--transport", "http", "--port", str(port))
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=errlog)
    try:
        wait_for_port(port, proc)
        tool = harness.tool_by_impl("get_price")
        args = surface_args(tool, {"product_id": PRODUCT})
        with SyncToolClient(url=f"http://127.0.0.1:{port}/mcp") as client:
            assert client.list_tools() == [t.mcp_spec() for t in harness.tools]
            out = client.call_tool(tool.name, args, timeout_s=3.0)
            assert out.status == "ok" and out.result["live_price"] == world.product(PRODUCT).live_price
            stats = measure_roundtrip(client, n=50, name=tool.name, arguments=args)
            print(f"\nMCP loopback round trip, http: p50 {stats['p50_ms']:.2f} ms, p95 {stats['p95_ms']:.2f} ms")
            assert 0 < stats["p50_ms"] <= stats["p95_ms"]
            # The server dies mid-session: the next call is a transport error, not an exception.
            proc.terminate()
            proc.wait(timeout=10)
            dead = client.call_tool(tool.name, args, timeout_s=2.0)
            assert dead.status == "transport_error"
            assert dead.latency_s < 2.5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_raw_json_rpc_with_malformed_call_params_names_the_field():
    """A client that sends a non-string tool name or non-object arguments gets -32602 naming the field; the
    server keeps serving."""
    import json

    proc = subprocess.Popen(server_command(PRODUCTION, SEED), cwd=str(REPO), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def call(message):
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline()) if "id" in message else None

    try:
        call({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        call({"jsonrpc": "2.0", "method": "notifications/initialized"})
        cases = [({"name": 5, "arguments": {}}, "params.name: expected a string (the tool's name), got int 5"),
                 ({"arguments": {}}, "params.name: expected a string (the tool's name), got nothing"),
                 ({"name": "get_price", "arguments": [1]},
                  "params.arguments: expected an object of the tool's arguments, got list [1]")]
        for i, (params, problem) in enumerate(cases):
            reply = call({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": params})
            assert reply["error"] == {"code": -32602, "message": f"Invalid request parameters: {problem}",
                                      "data": {"field": problem.split(":")[0]}}
        ok = call({"jsonrpc": "2.0", "id": 20, "method": "tools/call",
                   "params": {"name": "get_price", "arguments": {"product_id": PRODUCT}}})
        assert ok["result"]["_meta"]["hat-jax/status"] == "ok"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
