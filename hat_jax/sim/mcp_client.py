"""A tool client over MCP with a per-call timeout that never raises on a tool failure.

The deployed agent loop (`hat_jax.deploy.agent`) calls the world's tools through this client: the first tool call
with a 3 s timeout, later ones with 2 s (the HAT report, arXiv 2608.15763 (TaoLive, 2026), "Release
gates and guardrails", fallback), and turns any non-ok outcome into
a fallback. So `ToolClient.call_tool` returns a `ToolCallOutcome` for every way a call can end:

- "ok": the server answered with `isError` false;
- "error": the server answered with `isError` true (tool error, invalid arguments, unknown tool,
  injected empty result; `tool_status` holds the executor's status from `_meta`), or with a
  JSON-RPC error response;
- "timeout": no answer within `timeout_s` (the SDK's per-request read timeout, which also sends
  `notifications/cancelled`, and an `anyio.fail_after(timeout_s)` around the whole call; whichever
  fires first), or the server itself answered with a timeout status;
- "transport_error": the connection is gone (server exited, HTTP refused, closed stream).

Built on the official `mcp` SDK v2: `mcp.Client` over `mcp.client.stdio.stdio_client` (spawns the
server command; its stderr goes to `errlog`) or over Streamable HTTP (a URL). The protocol version
is negotiated by the SDK ("auto": `server/discover`, falling back to the initialize handshake).
`SyncToolClient` runs a `ToolClient` on a private event-loop thread for scripts and tests;
`measure_roundtrip` times sequential calls through it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Literal, TextIO

import anyio
import anyio.abc
import mcp_types as types
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from hat_jax.sim.mcp_server import META_CANONICAL_ARGS, META_IMPL, META_STATUS

logger = logging.getLogger("hat_jax.sim.mcp_client")

OutcomeStatus = Literal["ok", "error", "timeout", "transport_error"]
ROUNDTRIP_PROBE_TOOL = "__roundtrip_probe__"  # a name no harness uses: answered "unknown_tool" at once


@dataclasses.dataclass(frozen=True)
class ToolCallOutcome:
    """How one tool call ended.

    Attributes:
      status: "ok", "error", "timeout" or "transport_error" (see the module docstring).
      result: the payload the model sees: the server's `structuredContent` (else its text content
        parsed as JSON, else the text); for a timeout or transport error, {"error": message}.
      latency_s: wall time of the call on the client, in seconds.
      tool_status: the executor's status from the server ("ok", "error", "timeout", "empty",
        "invalid_arguments", "unknown_tool"), or "timeout" / "transport_error" / "rpc_error" when
        the server gave none.
      impl, canonical_args: the world binding the server reported ("" / {} when none).
    """

    status: OutcomeStatus
    result: dict | str
    latency_s: float
    tool_status: str = ""
    impl: str = ""
    canonical_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def server_command(harness: str, seed: int = 0, *extra: str, python: str = sys.executable) -> list[str]:
    """The argv that starts `hat_jax.sim.mcp_server` on stdio with this interpreter."""
    return [python, "-m", "hat_jax.sim.mcp_server", "--harness", str(harness), "--seed", str(seed), *extra]


def _payload(result: types.CallToolResult) -> dict | str:
    if isinstance(result.structured_content, dict):
        return result.structured_content
    text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if isinstance(parsed, dict) else text


def _find_leaf(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of `kind` in `exc` or its (nested) exception groups, or None."""
    if isinstance(exc, kind):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        if (found := _find_leaf(inner, kind)) is not None:
            return found
    return None


def _root_cause(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


class ToolClient:
    """An MCP client session to the tool server, as an async context manager.

    Exactly one of `command` (spawn the server on stdio) and `url` (Streamable HTTP, e.g.
    "http://127.0.0.1:8765/mcp") must be given.

    Args:
      command: argv of the server process (see `server_command`).
      url: the server's Streamable HTTP endpoint.
      cwd, env: working directory and extra environment of the spawned server (the SDK passes only a
        safe subset of this process's environment plus `env`).
      errlog: where the spawned server's stderr goes (a real file: it is handed to the subprocess).
      connect_timeout_s: read timeout of the handshake and of `list_tools` (per request).

    Raises (on entering): ConnectionError naming the server and the root cause when the server
    cannot be spawned or reached, exits, or does not answer the handshake within
    `connect_timeout_s`, or the first tool listing fails.
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        *,
        url: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        errlog: TextIO | None = None,
        connect_timeout_s: float = 30.0,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("ToolClient: give exactly one of `command` (stdio) and `url` (Streamable HTTP)")
        if command is not None:
            if not command:
                raise ValueError("ToolClient: `command` is empty")
            params = StdioServerParameters(command=command[0], args=list(command[1:]), cwd=cwd, env=dict(env or {}))
            server: Any = stdio_client(params, errlog=errlog if errlog is not None else sys.stderr)
        else:
            server = url
        self._target = url if url is not None else " ".join(command or ())
        self._client = Client(server, cache=None, read_timeout_seconds=connect_timeout_s)
        self._tools: list[dict] = []
        self._dead: str | None = None  # why the session ended, once it has

    async def __aenter__(self) -> ToolClient:
        self._stop = anyio.Event()
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            await self._task_group.start(self._hold_session)
        except BaseException as exc:
            self._stop.set()
            error: BaseException = exc
            try:
                await self._task_group.__aexit__(type(exc), exc, exc.__traceback__)
            except BaseException as group:  # the task group wraps the child's ConnectionError
                error = group
            connection_error = _find_leaf(error, ConnectionError)
            if connection_error is not None:
                raise connection_error from None
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self._stop.set()
        await self._task_group.__aexit__(*exc_info)

    async def _hold_session(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # The SDK session lives in this child task, so a transport that dies mid-run (server
        # exited, connection refused) ends this task only, never the caller's task group; later
        # calls answer "transport_error". The handshake and the listing are bounded by the
        # session's default read timeout.
        started = False
        try:
            async with self._client:
                # Listing once up front also primes the SDK's per-tool cache, so a first call
                # does not pay for a hidden `tools/list` inside its timeout.
                self._tools = await self._list()
                started = True
                task_status.started()
                await self._stop.wait()
        except Exception as exc:  # the SDK raises task-group ExceptionGroups; name the root cause
            if not started:
                raise ConnectionError(f"cannot connect to MCP tool server {self._target}: {_root_cause(exc)}") from exc
            self._dead = _root_cause(exc)
            logger.warning("MCP tool session to %s ended: %s", self._target, self._dead)

    async def _list(self) -> list[dict]:
        tools: list[dict] = []
        cursor: str | None = None
        while True:
            page = await self._client.list_tools(cursor=cursor)
            tools += [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                return tools

    async def list_tools(self) -> list[dict]:
        """The server's tools as MCP tool dicts (`name`, `description`, `inputSchema`), fetched anew."""
        self._tools = await self._list()
        return list(self._tools)

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None, timeout_s: float) -> ToolCallOutcome:
        """Call tool `name` with `arguments`, giving up after `timeout_s` seconds; never raises.

        Cancellation of the calling task still propagates (it is not a tool failure).
        """
        start = time.perf_counter()
        if self._dead is not None:
            return ToolCallOutcome("transport_error", {"error": f"session ended: {self._dead}"}, 0.0, "transport_error")

        def outcome(status: OutcomeStatus, result: dict | str, tool_status: str, **kw: Any) -> ToolCallOutcome:
            return ToolCallOutcome(status, result, time.perf_counter() - start, tool_status, **kw)

        try:
            with anyio.fail_after(timeout_s):
                res = await self._client.call_tool(name, dict(arguments or {}), read_timeout_seconds=timeout_s)
        except TimeoutError:
            return outcome("timeout", {"error": f"tool {name} timed out after {timeout_s:g} s"}, "timeout")
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return outcome("timeout", {"error": f"tool {name} timed out after {timeout_s:g} s"}, "timeout")
            if exc.code == CONNECTION_CLOSED:
                return outcome("transport_error", {"error": f"connection closed: {exc}"}, "transport_error")
            return outcome("error", {"error": str(exc), "code": exc.code}, "rpc_error")
        except Exception as exc:  # boundary: a broken transport becomes an outcome, not a crash
            return outcome("transport_error", {"error": f"{type(exc).__name__}: {exc}"}, "transport_error")
        meta = res.meta or {}
        tool_status = str(meta.get(META_STATUS, "error" if res.is_error else "ok"))
        status: OutcomeStatus = "ok" if not res.is_error else ("timeout" if tool_status == "timeout" else "error")
        return outcome(
            status,
            _payload(res),
            tool_status,
            impl=str(meta.get(META_IMPL, "")),
            canonical_args=dict(meta.get(META_CANONICAL_ARGS) or {}),
        )


class SyncToolClient:
    """A `ToolClient` driven from synchronous code: it runs on a private event-loop thread.

    Use as a context manager (or call `close()`); arguments are those of `ToolClient`.
    """

    def __init__(self, command: Sequence[str] | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = ToolClient(command, **kwargs)
        self._ready: Future[None] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)
        self._thread.start()
        try:
            self._ready.result()
        except BaseException:
            self._thread.join()
            self._loop.close()
            raise

    async def _main(self) -> None:
        # The session is entered and exited in this one task (anyio cancel scopes require it);
        # calls run as other tasks on the same loop.
        self._stop = asyncio.Event()
        try:
            async with self._client:
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                raise

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def list_tools(self) -> list[dict]:
        """See `ToolClient.list_tools`."""
        return self._run(self._client.list_tools())

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None, timeout_s: float) -> ToolCallOutcome:
        """See `ToolClient.call_tool`."""
        return self._run(self._client.call_tool(name, arguments, timeout_s))

    def close(self) -> None:
        """End the session (stops a spawned server) and the loop thread."""
        if self._thread.is_alive():
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SyncToolClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def measure_roundtrip(
    client: SyncToolClient,
    n: int = 50,
    name: str = ROUNDTRIP_PROBE_TOOL,
    arguments: Mapping[str, Any] | None = None,
    timeout_s: float = 5.0,
) -> dict[str, float]:
    """Client-side latency of `n` sequential `tools/call` round trips, after one warm-up call.

    Args:
      client: a connected client.
      n: number of timed calls (>= 1).
      name, arguments: the call to time; by default a probe name that the server answers at once
        as an unknown tool (a full request/response through the server's dispatch, no world work).

    Returns:
      {"p50_ms", "p95_ms", "mean_ms", "n"} (nearest-rank percentiles; n as a float).
    """
    if n < 1:
        raise ValueError(f"measure_roundtrip: n must be >= 1, got {n}")
    client.call_tool(name, arguments, timeout_s)
    lat = sorted(client.call_tool(name, arguments, timeout_s).latency_s * 1e3 for _ in range(n))

    def rank(q: float) -> float:  # nearest rank: the ceil(q * n)-th smallest
        return lat[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return {"p50_ms": rank(0.50), "p95_ms": rank(0.95), "mean_ms": sum(lat) / n, "n": float(n)}
