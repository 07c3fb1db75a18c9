"""Policies: what writes the assistant turns of a live-stream episode.

A policy maps the conversation so far (OpenAI chat-completions messages, `hat_jax.sim.types`) and the
current harness to the next assistant message. Two kinds exist:
- `hat_jax.sim.oracle.OracleTeacher`, the embedded "strong model": it reads the harness and the
  task's ground truth and writes the ideal turn (with configurable noise);
- `OpenAIChatPolicy`, a real strong model behind any OpenAI-compatible chat-completions server
  (vLLM, SGLang, `transformers serve`, a hosted API). It takes the oracle's place in rollouts and
  rejection sampling; it never sees the task's ground truth.

Variant implemented for `OpenAIChatPolicy` and why:
- one non-streaming `POST {base_url}/chat/completions` per turn with `tools=harness.openai_tools()`
  (the policy only needs the final message; streaming latency is measured by the deployment replay);
- our messages carry tool-call arguments as dicts and no call ids; the OpenAI wire format wants
  arguments as JSON text and `tool_call_id`s pairing calls with results, so outgoing messages get
  ids `call_<turn>_<i>` assigned in order, and each `tool` message takes the id of the call it
  answers (the environment appends one tool message per call, in call order);
- assistant `reasoning_content` is not sent back by default (servers differ: some reject it, the
  chat template drops past reasoning anyway); it is read from the reply as `reasoning_content`
  (DeepSeek, vLLM < 0.10) or `reasoning` (newer vLLM);
- HTTP goes through `httpx2`, the HTTP client the `mcp` SDK installs (the `httpx` API).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import httpx2 as httpx

from hat_jax.harness.state import HarnessState
from hat_jax.sim.types import Task


class PolicyError(RuntimeError):
    """A policy could not produce an assistant message (server error, malformed response)."""


@runtime_checkable
class Policy(Protocol):
    """Writes the next assistant turn.

    `act(messages, harness, task)` takes the conversation so far (system, user, assistant, tool ...
    messages in the `hat_jax.sim.types` format), the harness the episode runs under, and the task
    (ground truth; None or ignored for a policy that must not see it), and returns one assistant
    message: {"role": "assistant", "content": str, "reasoning_content": str, "tool_calls": [...]}
    with `tool_calls` absent on a reply turn and each call {"type": "function", "function":
    {"name": str, "arguments": dict}}.
    """

    def act(self, messages: list[dict], harness: HarnessState, task: Task | None) -> dict: ...


@runtime_checkable
class SeedablePolicy(Policy, Protocol):
    """A policy whose sampling can be re-seeded: `with_seed(seed)` returns a copy drawing differently.

    Rejection sampling uses it to make repeated attempts at one task differ.
    """

    def with_seed(self, seed: int) -> Policy: ...


def to_openai_messages(messages: Sequence[Mapping[str, Any]], *, send_reasoning: bool = False) -> list[dict]:
    """Converts our messages to the OpenAI wire format (JSON-text arguments, call ids).

    Args:
      messages: conversation in the `hat_jax.sim.types` format.
      send_reasoning: keep assistant `reasoning_content` in the outgoing messages.
    Returns:
      new message dicts; assistant tool calls get ids `call_<k>_<i>` (k: index of the assistant
      message, i: index of the call) and each following `tool` message the id of the next
      unanswered call.
    Raises:
      PolicyError: a message has no known role, or a tool message answers no pending call.
    """
    out: list[dict] = []
    pending: list[str] = []
    for k, msg in enumerate(messages):
        role = msg.get("role")
        if role in ("system", "user"):
            out.append({"role": role, "content": str(msg.get("content") or "")})
        elif role == "assistant":
            wire: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
            if send_reasoning and msg.get("reasoning_content"):
                wire["reasoning_content"] = msg["reasoning_content"]
            calls = msg.get("tool_calls") or []
            if calls:
                wire["tool_calls"] = []
                pending = []
                for i, call in enumerate(calls):
                    fn = call["function"]
                    args = fn.get("arguments", {})
                    call_id = f"call_{k}_{i}"
                    pending.append(call_id)
                    wire["tool_calls"].append(
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": fn["name"],
                                "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                            },
                        }
                    )
            out.append(wire)
        elif role == "tool":
            if not pending:
                raise PolicyError(f"messages[{k}]: a tool message with no pending assistant tool call")
            out.append(
                {"role": "tool", "tool_call_id": pending.pop(0), "name": msg.get("name", ""), "content": msg.get("content", "")}
            )
        else:
            raise PolicyError(f"messages[{k}].role: expected system/user/assistant/tool, got {role!r}")
    return out


def parse_chat_completion(body: Any) -> dict:
    """Maps a chat-completions response body to our assistant message.

    Args:
      body: the parsed JSON response.
    Returns:
      {"role": "assistant", "content": str, "reasoning_content": str} plus "tool_calls" (arguments
      parsed to dicts) when the model called tools.
    Raises:
      PolicyError: a field is missing or has the wrong type (the message names it), or a call's
        arguments are not a JSON object.
    """
    if not isinstance(body, Mapping):
        raise PolicyError(f"response: expected a JSON object, got {type(body).__name__}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise PolicyError("response.choices: expected a non-empty list")
    msg = choices[0].get("message") if isinstance(choices[0], Mapping) else None
    if not isinstance(msg, Mapping):
        raise PolicyError("response.choices[0].message: expected an object")
    content = msg.get("content")
    if content is not None and not isinstance(content, str):
        raise PolicyError(f"response.choices[0].message.content: expected a string or null, got {type(content).__name__}")
    reasoning = msg.get("reasoning_content")
    if reasoning is None:
        reasoning = msg.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise PolicyError("response.choices[0].message.reasoning_content: expected a string or null")
    out: dict[str, Any] = {"role": "assistant", "content": (content or "").strip(), "reasoning_content": (reasoning or "").strip()}
    raw_calls = msg.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise PolicyError("response.choices[0].message.tool_calls: expected a list")
    calls = []
    for i, call in enumerate(raw_calls):
        where = f"response.choices[0].message.tool_calls[{i}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise PolicyError(f"{where}.function: expected an object")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise PolicyError(f"{where}.function.name: expected a non-empty string")
        raw_args = fn.get("arguments", "{}")
        if isinstance(raw_args, str):
            try:
                args = json.loads(raw_args) if raw_args.strip() else {}
            except json.JSONDecodeError as exc:
                raise PolicyError(f"{where}.function.arguments: not valid JSON ({exc.msg}): {raw_args[:200]!r}") from exc
        else:
            args = raw_args
        if not isinstance(args, Mapping):
            raise PolicyError(f"{where}.function.arguments: expected a JSON object, got {type(args).__name__}")
        calls.append({"type": "function", "function": {"name": name, "arguments": dict(args)}})
    if calls:
        out["tool_calls"] = calls
    return out


class OpenAIChatPolicy:
    """A real strong model over an OpenAI-compatible chat-completions API (non-streaming).

    Args:
      base_url: the API root including the version, e.g. "http://127.0.0.1:8000/v1".
      model: the served model name.
      api_key: sent as `Authorization: Bearer <key>` when given.
      temperature, top_p: sampling parameters sent with every request.
      timeout_s: per-request timeout in seconds.
      seed: sent as the request's `seed` when given (servers that honour it sample reproducibly).
      max_tokens: sent when given.
      send_reasoning: send past assistant reasoning back to the server.
      extra_body: merged into every request body (server-specific options).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 1.0,
        top_p: float = 0.95,
        timeout_s: float = 60.0,
        *,
        seed: int | None = None,
        max_tokens: int | None = None,
        send_reasoning: bool = False,
        extra_body: Mapping[str, Any] | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.top_p = top_p
        self.timeout_s = timeout_s
        self.seed = seed
        self.max_tokens = max_tokens
        self.send_reasoning = send_reasoning
        self.extra_body = dict(extra_body or {})

    def with_seed(self, seed: int) -> OpenAIChatPolicy:
        """A copy sending `seed` with its requests."""
        return OpenAIChatPolicy(
            self.base_url, self.model, self.api_key, self.temperature, self.top_p, self.timeout_s,
            seed=seed, max_tokens=self.max_tokens, send_reasoning=self.send_reasoning, extra_body=self.extra_body,
        )  # fmt: skip

    def request_body(self, messages: Sequence[Mapping[str, Any]], harness: HarnessState) -> dict:
        """The JSON body of the chat-completions request for `messages` under `harness`."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(messages, send_reasoning=self.send_reasoning),
            "tools": harness.openai_tools(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": False,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        return body

    def act(self, messages: list[dict], harness: HarnessState, task: Task | None = None) -> dict:
        """Asks the server for the next assistant turn (the task's ground truth is never sent).

        Raises:
          PolicyError: connection failure or timeout, non-2xx HTTP status (with the body's start),
            a body that is not JSON, or a malformed completion (naming the field).
        """
        url = f"{self.base_url}/chat/completions"
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            resp = httpx.post(url, json=self.request_body(messages, harness), headers=headers, timeout=self.timeout_s)
        except httpx.TimeoutException as exc:
            raise PolicyError(f"POST {url}: no response within {self.timeout_s} s") from exc
        except httpx.HTTPError as exc:
            raise PolicyError(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= resp.status_code < 300:
            raise PolicyError(f"POST {url}: HTTP {resp.status_code}: {resp.text[:500]}")
        try:
            body = resp.json()
        except ValueError as exc:
            raise PolicyError(f"POST {url}: response body is not JSON: {resp.text[:200]!r}") from exc
        return parse_chat_completion(body)
