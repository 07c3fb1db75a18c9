"""A streaming OpenAI-compatible chat-completions client that times the first token and the first reply text.

Variant implemented and why:
- one `POST {base_url}/chat/completions` with `"stream": true` per model turn, read as Server-Sent
  Events (`data:` lines, events split by blank lines, `data: [DONE]` optional: `transformers serve`
  ends the stream after the chunk with `finish_reason` and `usage`, vLLM and hosted APIs send
  `[DONE]`). Deltas may carry `content`, `reasoning_content` (or vLLM's `reasoning`) and
  `tool_calls` (assembled by `index`, argument text concatenated); servers differ in which they
  split out, so the agent loop gets all three and parses `<tool_call>` text itself;
- timing, in seconds from the start of the call (`time.perf_counter`): `t_first_chunk` is the first
  SSE event of any kind (`transformers serve` sends a role-only header before generating);
  `t_first_token` the first delta that carries generated text of any kind (reasoning, content or a
  tool call) - this is what the replay reports as "first token". Whitespace-only deltas do not
  count: `transformers serve` sends the "\\n" that follows the prompt's `<think>` as a reasoning
  delta before it has computed anything. `content_marks` records
  (time, content length so far) after every content delta so that the time the *reply* text
  started (after a `</think>` the server did not split off) can be found afterwards
  (`StreamResult.time_content_reaches`);
- generated tokens: `usage.completion_tokens` when the server sends usage (we ask for it with
  `stream_options.include_usage`), else the number of deltas that carried text (one token per
  delta is what streaming servers send); decode speed is (tokens - 1) / (last token - first token);
- every way a call can fail is a recorded `status`, never an exception: "http_error" (status and
  the start of the body), "connect_error", "timeout" (the caller's deadline passed), "stalled" (no
  bytes for `stall_timeout_s`), "malformed" (an event that is not a chat-completion chunk),
  "stream_error" (the server reported an error inside the stream), "broken" (the connection ended
  before a `finish_reason`). HTTP goes through `httpx2`, the client the `mcp` SDK installs.
- `check_endpoint` fails fast before a replay (wrong base URL, wrong model name).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx2 as httpx

BODY_PREVIEW = 500  # characters of an error body kept in messages


class EndpointError(RuntimeError):
    """The server answered, but not as the configured endpoint/model (wrong URL or model name).

    Attributes: status (HTTP status code), body (the start of the response body).
    """

    def __init__(self, message: str, status: int = 0, body: str = ""):
        super().__init__(message)
        self.status, self.body = status, body


class ServerUnreachable(RuntimeError):
    """No HTTP answer at all (connection refused, DNS failure, connect timeout)."""


@dataclasses.dataclass
class StreamResult:
    """One streamed model turn.

    Attributes:
      status: "ok" or a failure kind (module docstring).
      error: what went wrong ("" when ok).
      content, reasoning: the concatenated text deltas.
      tool_calls: server-parsed calls [{"name": str, "arguments": str (JSON text)}], by index.
      finish_reason: the server's, or None when the stream ended without one.
      completion_tokens: generated tokens; `tokens_source` says "usage" or "deltas".
      t_first_chunk, t_first_token, t_last_token: seconds from the start of the call (None if never).
      wall_s: seconds from the start of the call to its end.
      content_marks: [(seconds, len(content) after the delta)] for every non-empty content delta.
    """

    status: str = "ok"
    error: str = ""
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    tokens_source: str = "deltas"
    t_first_chunk: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    wall_s: float = 0.0
    content_marks: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the stream completed with a finish reason."""
        return self.status == "ok"

    @property
    def decode(self) -> tuple[int, float]:
        """(tokens after the first, seconds from the first to the last token); (0, 0.0) if < 2 tokens."""
        if self.t_first_token is None or self.t_last_token is None or self.completion_tokens < 2:
            return 0, 0.0
        return self.completion_tokens - 1, max(0.0, self.t_last_token - self.t_first_token)

    def time_content_reaches(self, offset: int) -> float | None:
        """Seconds from the call start until `content` was longer than `offset` characters (None if never)."""
        return next((t for t, length in self.content_marks if length > offset), None)


def _sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The data payloads of a Server-Sent Events stream (multi-line data joined with newlines)."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith(":"):
            continue  # comment / keep-alive
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        # other fields (event:, id:, retry:) carry nothing for chat completions
    if data:
        yield "\n".join(data)


def _visible(delta: Mapping[str, Any]) -> bool:
    """Whether a delta carries a tool call or non-whitespace text (whitespace-only deltas do not start TTFT)."""
    if delta.get("tool_calls"):
        return True
    return any(isinstance(delta.get(k), str) and delta[k].strip() for k in ("content", "reasoning_content", "reasoning"))


class ChatStreamClient:
    """Streams chat completions from one OpenAI-compatible server for one model.

    Args:
      base_url: the API root including the version, e.g. "http://127.0.0.1:8000/v1".
      model: the served model name (sent as `model`).
      api_key: sent as `Authorization: Bearer <key>` when given.
      temperature, top_p: sampling (the paper's deployment: 1.0 and 0.95).
      max_tokens: per turn, sent when given.
      seed: sent as `seed` when given.
      extra_body: merged into every request body (server options, e.g. `chat_template_kwargs`).
      connect_timeout_s: TCP connect timeout.
      stall_timeout_s: longest silence inside a stream before it counts as stalled.
    Raises:
      ValueError: base_url is not an http(s) URL.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float = 1.0,
        top_p: float = 0.95,
        max_tokens: int | None = None,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        connect_timeout_s: float = 5.0,
        stall_timeout_s: float = 5.0,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected an http(s) URL, got {base_url!r}")
        self.base_url, self.model = base_url.rstrip("/"), model
        self.temperature, self.top_p, self.max_tokens, self.seed = temperature, top_p, max_tokens, seed
        self.extra_body = dict(extra_body or {})
        self.connect_timeout_s, self.stall_timeout_s = connect_timeout_s, stall_timeout_s
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(headers=headers, limits=httpx.Limits(max_connections=64))

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> ChatStreamClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ preflight
    def check_endpoint(self) -> str:
        """Checks that the server answers and serves `model`; sends at most one 1-token request.

        `GET /models` first (a 404 there means a wrong base URL); when the model is not listed (`transformers
        serve` lists only its hub cache, never the folder it was started with), a one-token non-streaming
        request, which a wrong model name fails with the server's status and body.

        Returns:
          "listed" (GET /models lists the model) or "probed" (a 1-token request succeeded).
        Raises:
          ServerUnreachable: no HTTP answer (refused, DNS, connect timeout).
          EndpointError: GET /models answered 404 (wrong base URL), or the probe answered a
            non-2xx status (wrong model name, ...), with the status and the body's start.
        """
        url = f"{self.base_url}/models"
        timeout = httpx.Timeout(self.connect_timeout_s, read=30.0)
        try:
            resp = self._http.get(url, timeout=timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServerUnreachable(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code == 404:
            raise EndpointError(
                f"GET {url}: HTTP 404: {resp.text[:BODY_PREVIEW]} (is --base-url the API root, e.g. http://HOST:PORT/v1?)",
                404, resp.text[:BODY_PREVIEW],
            )  # fmt: skip
        if 200 <= resp.status_code < 300:
            try:
                ids = [m.get("id") for m in resp.json().get("data", []) if isinstance(m, Mapping)]
            except (ValueError, AttributeError):
                ids = []
            if self.model in ids:
                return "listed"
        body = {"model": self.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": False}
        url = f"{self.base_url}/chat/completions"
        try:
            resp = self._http.post(url, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= resp.status_code < 300:
            raise EndpointError(
                f"POST {url} (model {self.model!r}): HTTP {resp.status_code}: {resp.text[:BODY_PREVIEW]}",
                resp.status_code, resp.text[:BODY_PREVIEW],
            )  # fmt: skip
        return "probed"

    # ------------------------------------------------------------------ one turn
    def request_body(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> dict:
        """The JSON body of a streamed turn (`messages` already in the OpenAI wire format)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if tools:
            body["tools"] = list(tools)
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.seed is not None:
            body["seed"] = self.seed
        body.update(self.extra_body)
        return body

    def stream_chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
        deadline: float | None = None,
    ) -> StreamResult:  # fmt: skip
        """Streams one assistant turn; never raises for server or network failures.

        Args:
          messages: OpenAI wire-format messages (`hat_jax.sim.policy.to_openai_messages`).
          tools: OpenAI tool definitions sent with the request.
          deadline: `time.perf_counter()` value after which the call gives up with status "timeout".
        Returns:
          a `StreamResult` (module docstring for the statuses and the timing fields).
        """
        start = time.perf_counter()
        out = StreamResult()
        remaining = (deadline - start) if deadline is not None else float("inf")
        if remaining <= 0:
            out.status, out.error = "timeout", "no time left before the request"
            return out
        cap = min(remaining, 1e6)
        timeout = httpx.Timeout(min(self.stall_timeout_s, cap), connect=min(self.connect_timeout_s, cap), pool=cap)
        url = f"{self.base_url}/chat/completions"
        try:
            with self._http.stream("POST", url, json=self.request_body(messages, tools), timeout=timeout) as resp:
                if not 200 <= resp.status_code < 300:
                    text = resp.read().decode("utf-8", "replace")[:BODY_PREVIEW]
                    out.status, out.error = "http_error", f"HTTP {resp.status_code}: {text}"
                else:
                    self._read_events(resp, out, start, deadline)
        except httpx.TimeoutException as exc:
            past = deadline is not None and time.perf_counter() >= deadline - 1e-3
            out.status = "timeout" if past else ("connect_error" if isinstance(exc, httpx.ConnectTimeout) else "stalled")
            out.error = f"{type(exc).__name__}: no data within the {'deadline' if past else 'stall timeout'}"
        except httpx.ConnectError as exc:
            out.status, out.error = "connect_error", f"{type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:  # RemoteProtocolError, ReadError, ...: the connection broke
            out.status, out.error = "broken", f"{type(exc).__name__}: {exc}"
        out.wall_s = time.perf_counter() - start
        return out

    def _read_events(self, resp: Any, out: StreamResult, start: float, deadline: float | None) -> None:
        calls: dict[int, dict] = {}
        try:
            self._read_chunks(resp, out, start, deadline, calls)
        finally:  # what arrived is kept even when the stream failed
            out.tool_calls = [calls[i] for i in sorted(calls)]

    def _read_chunks(self, resp: Any, out: StreamResult, start: float, deadline: float | None, calls: dict) -> None:
        usage_tokens: int | None = None
        done = False
        for data in _sse_events(resp.iter_lines()):
            now = time.perf_counter() - start
            if out.t_first_chunk is None:
                out.t_first_chunk = now
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                out.status, out.error = "malformed", f"event is not JSON: {data[:200]!r}"
                return
            if not isinstance(chunk, Mapping):
                out.status, out.error = "malformed", f"event is not a JSON object: {data[:200]!r}"
                return
            if chunk.get("error") is not None:
                out.status = "stream_error"
                out.error = f"server error in stream: {json.dumps(chunk['error'])[:BODY_PREVIEW]}"
                return
            usage = chunk.get("usage")
            if isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
                usage_tokens = usage["completion_tokens"]
            choices = chunk.get("choices")
            if not isinstance(choices, list):
                out.status, out.error = "malformed", f"chunk without a choices list: {data[:200]!r}"
                return
            for choice in choices:
                delta = choice.get("delta") if isinstance(choice, Mapping) else None
                if not isinstance(delta, Mapping):
                    out.status, out.error = "malformed", f"choice without a delta object: {data[:200]!r}"
                    return
                got = self._apply_delta(delta, out, calls, now)
                if got is None:
                    return
                if got:
                    out.completion_tokens += 1  # one token per delta until `usage` says otherwise
                    out.t_last_token = now
                    if out.t_first_token is None and _visible(delta):
                        out.t_first_token = now
                if choice.get("finish_reason"):
                    out.finish_reason = str(choice["finish_reason"])
            if deadline is not None and time.perf_counter() >= deadline:
                out.status, out.error = "timeout", "deadline passed while streaming"
                return
        if usage_tokens is not None:
            out.completion_tokens, out.tokens_source = usage_tokens, "usage"
        if out.finish_reason is None and not done:
            out.status, out.error = "broken", "stream ended without a finish_reason"
        elif out.finish_reason is None:
            out.finish_reason = "stop"

    @staticmethod
    def _apply_delta(delta: Mapping[str, Any], out: StreamResult, calls: dict[int, dict], now: float) -> bool | None:
        """Adds one delta to `out`; True if it carried generated text, None if malformed (status set)."""
        got = False
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                out.status, out.error = "malformed", f"delta.{key} is {type(value).__name__}, expected a string"
                return None
            if not value:
                continue
            got = True
            if key == "content":
                out.content += value
                out.content_marks.append((now, len(out.content)))
            elif key == "reasoning_content" or "reasoning_content" not in delta:
                out.reasoning += value
        raw_calls = delta.get("tool_calls")
        if raw_calls is not None:
            if not isinstance(raw_calls, list):
                out.status, out.error = "malformed", "delta.tool_calls is not a list"
                return None
            for i, call in enumerate(raw_calls):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(fn, Mapping):
                    out.status, out.error = "malformed", "delta.tool_calls entry without a function object"
                    return None
                index = call.get("index", i)
                entry = calls.setdefault(int(index) if isinstance(index, int) else i, {"name": "", "arguments": ""})
                entry["name"] += str(fn.get("name") or "")
                args = fn.get("arguments") or ""
                entry["arguments"] += args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                got = True
        return got
