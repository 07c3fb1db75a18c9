"""The live-stream world's tools served over MCP, on the official `mcp` SDK (v2, low-level `Server`).

    python -m hat_jax.sim.mcp_server --harness hat_jax/harnesses/production --seed 0
    python -m hat_jax.sim.mcp_server --harness DIR --seed 0 --transport http --port 8765   # URL .../mcp

What is served: every tool of the harness, listed with its surface `name`, `description` and
`inputSchema` exactly as `Tool.mcp_spec()` gives them (the low-level `Server` takes the listing from
an `on_list_tools` handler, so the tools come from the harness file at start-up, not from decorated
Python functions). A `tools/call` is dispatched to `hat_jax.sim.executor.execute_tool_call` over a
`World.generate(seed, n_products)`, so the server and the in-process environment answer the same
call with the same result. The result is one JSON text content block (the JSON the model sees in its
`tool` message, `ensure_ascii=False`) plus the same object as `structuredContent`; `isError` is set
for every status other than "ok" (including "empty", "invalid_arguments" and "unknown_tool"). The
executor's status, the tool's impl and the canonical arguments travel in the result's `_meta`
(`tool_result`) for the agent loop's records; the model never sees `_meta`.

Faults: each call draws at most one fault ("error", "timeout", "empty") with the given rates
(`hat_jax.sim.executor.draw_fault`, one draw per call from one `random.Random(fault_seed)` stream,
in call arrival order: deterministic for a sequential client). The executor applies it only to a
call that passed validation, and never to the skill loader. An applied "timeout" *really* sleeps
`--timeout-fault-s` seconds (default 30, past any per-call timeout of the agent loop) before the
executor's timeout error, so the client sees a real timeout; a client that gives up sends
`notifications/cancelled` and the SDK cancels the sleeping handler. `--tool-delay-s` adds a fixed delay
to every call (latency experiments).

Transports: "stdio" (stdout carries JSON-RPC, so every log line goes to stderr) and the SDK's
Streamable HTTP app served by uvicorn on `--host`/`--port` at path `/mcp`, answering plain JSON
(`json_response=True`: no SSE framing; this server sends no progress notifications), on a socket bound
before "serving ..." is logged (`serve_http`). Exit status 2 on bad options or input (`main`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from hat_jax.cli_types import int_in
from hat_jax.harness.state import HarnessState
from hat_jax.sim.catalog import MAX_PRODUCTS, MIN_PRODUCTS, World
from hat_jax.sim.executor import check_fault_rates, draw_fault, execute_tool_call
from hat_jax.sim.world_harness import harness_dir, load_world_harness

logger = logging.getLogger("hat_jax.sim.mcp_server")

META_STATUS = "hat-jax/status"  # `_meta` key: the executor's status ("ok", "error", "invalid_arguments", ...)
META_IMPL = "hat-jax/impl"  # `_meta` key: the world function the tool is bound to ("" when unknown)
META_CANONICAL_ARGS = "hat-jax/canonical_args"  # `_meta` key: arguments under canonical names
HTTP_PATH = "/mcp"

# (name, arguments, fault) -> ToolExecution(status, result, canonical_args, impl)
Execute = Callable[[str, Mapping[str, Any], "str | None"], Any]


@dataclasses.dataclass(frozen=True)
class FaultConfig:
    """Fault injection and delays of the tool server.

    Attributes:
      rates: fault kind ("error", "timeout", "empty") -> probability per call; the sum must be <= 1.
      seed: seed of the fault stream (one `random.Random(seed)` draw per call).
      tool_delay_s: sleep before every call, in seconds.
      timeout_fault_s: how long a "timeout" fault sleeps before answering with a timeout error.
    """

    rates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    seed: int = 0
    tool_delay_s: float = 0.0
    timeout_fault_s: float = 30.0

    def __post_init__(self) -> None:
        check_fault_rates(self.rates, "FaultConfig.rates")
        if not (self.tool_delay_s >= 0 and self.timeout_fault_s >= 0):
            raise ValueError("FaultConfig.tool_delay_s and timeout_fault_s must be >= 0")


def tool_result(status: str, result: Any, *, impl: str = "", canonical_args: Mapping[str, Any] | None = None) -> types.CallToolResult:
    """An executor outcome as an MCP `CallToolResult`.

    Args:
      status: the executor status; anything but "ok" sets `isError`.
      result: the payload the model sees (a dict, normally); sent as JSON text and, when a dict,
        as `structuredContent` (a non-dict payload is wrapped as {"result": payload} there).
      impl, canonical_args: recorded in `_meta` with the status (keys `hat-jax/status`, `hat-jax/impl`,
        `hat-jax/canonical_args`), for the agent loop's records; the model never sees `_meta`.
    """
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    structured = result if isinstance(result, dict) else {"result": result}
    meta = {META_STATUS: status, META_IMPL: impl, META_CANONICAL_ARGS: dict(canonical_args or {})}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=status != "ok",
        _meta=meta,
    )


def build_server(harness: HarnessState, execute: Execute, faults: FaultConfig | None = None) -> Server:
    """A low-level MCP `Server` listing `harness.tools` and dispatching calls to `execute`.

    Args:
      harness: the tools to list (surface names, descriptions, schemas, in harness order).
      execute: `(name, arguments, fault) -> ToolExecution` (fields `status`, `result`,
        `canonical_args`, `impl`); normally `execute_tool_call` bound to a world and `harness`.
        It must not raise for model mistakes (unknown tool, bad arguments); if it raises anyway,
        the call answers with an "error" result naming the exception.
      faults: fault rates and delays; None means no faults and no delay.

    Returns:
      the server; run it with `serve_stdio` / `serve_http` (or `Server.run` on any streams).
    """
    faults = faults or FaultConfig()
    rng = random.Random(faults.seed)
    listing = types.ListToolsResult(tools=[types.Tool.model_validate(t.mcp_spec()) for t in harness.tools])

    async def on_list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return listing

    async def on_call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        name, arguments = params.name, dict(params.arguments or {})
        fault = draw_fault(rng, faults.rates)
        if faults.tool_delay_s:
            await anyio.sleep(faults.tool_delay_s)
        try:
            execution = execute(name, arguments, fault)
        except Exception as exc:  # boundary: a bug in the world must not kill the server
            logger.exception("tool %s raised", name)
            return tool_result("error", {"error": f"internal error: {type(exc).__name__}: {exc}"})
        if execution.status == "timeout":  # the executor applied the injected fault: really time out
            logger.info("tool %s: injected timeout, sleeping %.1f s", name, faults.timeout_fault_s)
            await anyio.sleep(faults.timeout_fault_s)
        logger.debug("tool %s -> %s", name, execution.status)
        return tool_result(execution.status, execution.result, impl=execution.impl, canonical_args=execution.canonical_args)

    server = Server(
        f"hat-jax-tools-{harness.name}",
        version=harness.version,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )
    server.middleware.append(check_call_params)
    return server


def call_params_problem(params: Mapping[str, Any] | None) -> str | None:
    """What is wrong with raw `tools/call` params ({"name": str, "arguments": object?}), or None.

    The MCP library answers a malformed call with -32602 "Invalid request parameters" and no detail;
    this names the field and what was expected.
    """
    if not isinstance(params, Mapping):
        return f"params: expected an object with a string 'name', got {type(params).__name__}"
    name = params.get("name")
    if not isinstance(name, str):
        got = "nothing" if "name" not in params else f"{type(name).__name__} {json.dumps(name, default=str)[:80]}"
        return f"params.name: expected a string (the tool's name), got {got}"
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, Mapping):
        return (f"params.arguments: expected an object of the tool's arguments, got {type(arguments).__name__} "
                f"{json.dumps(arguments, default=str)[:80]}")
    return None


async def check_call_params(ctx: ServerRequestContext, call_next):
    """Server middleware: a malformed `tools/call` gets -32602 with a message naming the field."""
    if ctx.method == "tools/call" and (problem := call_params_problem(ctx.params)):
        raise MCPError(code=types.INVALID_PARAMS, message=f"Invalid request parameters: {problem}",
                       data={"field": problem.split(":", 1)[0]})
    return await call_next(ctx)


async def serve_stdio(server: Server) -> None:
    """Serve `server` over this process's stdin/stdout until stdin closes."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to (host, port) (IPv6 when `host` is an IPv6 address).

    Raises:
      OSError: the address cannot be bound (port in use, no permission, unknown host).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(
    server: Server, host: str = "127.0.0.1", port: int = 8765, sock: socket.socket | None = None
) -> None:
    """Serve `server` over Streamable HTTP at `http://host:port/mcp` (uvicorn, logs on stderr).

    The socket is bound here, before it is handed to uvicorn, so "serving ..." is logged only once the port is
    bound, and a port that cannot be bound (in use, no permission) is reported as such.

    Args:
      server: the MCP server.
      host, port: the address (bound here with `bind_socket` unless `sock` is given).
      sock: an already bound listening socket to serve on.
    Raises:
      OSError: the address cannot be bound.
    """
    import uvicorn

    sock = sock if sock is not None else bind_socket(host, port)
    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, json_response=True, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, log_level="warning")
    logger.info("serving MCP over HTTP at http://%s:%d%s", host, port, HTTP_PATH)
    await uvicorn.Server(config).serve(sockets=[sock])


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hat_jax.sim.mcp_server", description=__doc__.split("\n")[0])
    p.add_argument("--harness", required=True,
                   help="a shipped harness (production, compact), a harness directory or its harness.yaml")
    p.add_argument("--seed", type=int, required=True, help="world seed (World.generate)")
    p.add_argument(
        "--n-products",
        type=int_in(MIN_PRODUCTS, MAX_PRODUCTS),
        default=240,
        help=f"catalog size, {MIN_PRODUCTS}-{MAX_PRODUCTS}",
    )
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int_in(1, 65535), default=8765, help="HTTP port, 1-65535")
    p.add_argument("--fault-error", type=float, default=0.0, help="rate of injected tool errors")
    p.add_argument("--fault-timeout", type=float, default=0.0, help="rate of injected timeouts (real sleeps)")
    p.add_argument("--fault-empty", type=float, default=0.0, help="rate of injected empty results")
    p.add_argument("--fault-seed", type=int, default=0)
    p.add_argument("--tool-delay-s", type=float, default=0.0, help="sleep before every call")
    p.add_argument("--timeout-fault-s", type=float, default=30.0, help="how long an injected timeout sleeps")
    p.add_argument(
        "--log-level", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), default="INFO"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status: 2, with the reason on stderr, on bad options
    (argparse exits with 2 itself on `--n-products` outside [`MIN_PRODUCTS`, `MAX_PRODUCTS`], `--port` outside
    1-65535, an unknown `--log-level`), fault rates that fail `check_fault_rates`, a bad `--harness` path, a
    harness that fails validation, or an HTTP port that cannot be bound."""
    args = _parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    try:
        path = harness_dir(args.harness)
    except ValueError as exc:
        print(f"mcp_server: error: --harness {args.harness}: {exc}", file=sys.stderr)
        return 2
    try:
        harness = load_world_harness(path)
    except Exception as exc:  # HarnessError names file and field; anything else is reported the same way
        print(f"mcp_server: error: --harness {args.harness}: {exc}", file=sys.stderr)
        return 2
    try:
        faults = FaultConfig(
            rates={"error": args.fault_error, "timeout": args.fault_timeout, "empty": args.fault_empty},
            seed=args.fault_seed,
            tool_delay_s=args.tool_delay_s,
            timeout_fault_s=args.timeout_fault_s,
        )
    except ValueError as exc:
        print(f"mcp_server: error: {exc}", file=sys.stderr)
        return 2
    world = World.generate(seed=args.seed, n_products=args.n_products)

    def execute(name: str, arguments: Mapping[str, Any], fault: str | None) -> Any:
        return execute_tool_call(world, harness, name, arguments, fault=fault)

    server = build_server(harness, execute, faults)
    logger.info(
        "harness %s %s (%d tools), world seed %d, transport %s",
        harness.name, harness.version, len(harness.tools), args.seed, args.transport,
    )
    if args.transport == "stdio":
        anyio.run(serve_stdio, server)
        return 0
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"mcp_server: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    anyio.run(serve_http, server, args.host, args.port, sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
