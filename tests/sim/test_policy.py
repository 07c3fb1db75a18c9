"""`OpenAIChatPolicy` against a tiny local chat-completions server; message mapping by hand."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hat_jax.harness.state import HarnessState, Tool
from hat_jax.sim.policy import OpenAIChatPolicy, Policy, PolicyError, parse_chat_completion, to_openai_messages

HARNESS = HarnessState(
    name="t",
    version="0",
    skill_tool="load_skill",
    skills=(),
    tools=(
        Tool("load_skill", "加载技能", {"type": "object", "properties": {"name": {"type": "string"}}}, "load_skill", {"name": ("name",)}),
        Tool("get_price", "查价格", {"type": "object", "properties": {"product_id": {"type": "string"}}}, "get_price", {"product_id": ("product_id",)}),
    ),
    sections=(),
)
MESSAGES = [
    {"role": "system", "content": "你是主播"},
    {"role": "user", "content": "P001多少钱"},
    {"role": "assistant", "content": "", "reasoning_content": "先加载技能", "tool_calls": [
        {"type": "function", "function": {"name": "load_skill", "arguments": {"name": "price-promotion"}}}]},
    {"role": "tool", "name": "load_skill", "content": "{\"skill\": \"price-promotion\"}"},
]  # fmt: skip
COMPLETION = {
    "id": "x",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "reasoning_content": "查价格",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_price", "arguments": "{\"product_id\": \"P001\"}"}}],
    }}],
}  # fmt: skip


class _Server:
    """A chat-completions server on 127.0.0.1:0 answering with `reply` (status, body) and recording requests."""

    def __init__(self, status: int, reply: object):
        self.requests: list[tuple[str, dict, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, dict(self.headers), body))
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_act_sends_model_messages_tools_and_maps_the_tool_call():
    server = _Server(200, COMPLETION)
    with server as url:
        policy = OpenAIChatPolicy(url, "strong-model", api_key="k", temperature=0.7, top_p=0.9)
        msg = policy.act(MESSAGES, HARNESS, None)
    assert isinstance(policy, Policy)
    assert msg == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "查价格",
        "tool_calls": [{"type": "function", "function": {"name": "get_price", "arguments": {"product_id": "P001"}}}],
    }
    (path, headers, body), = server.requests  # fmt: skip
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer k"
    assert body["model"] == "strong-model" and body["stream"] is False
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)
    assert body["tools"] == HARNESS.openai_tools()
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    call = body["messages"][2]["tool_calls"][0]
    assert call == {"id": "call_2_0", "type": "function", "function": {"name": "load_skill", "arguments": '{"name": "price-promotion"}'}}
    assert "reasoning_content" not in body["messages"][2]
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_2_0", "name": "load_skill", "content": '{"skill": "price-promotion"}'}


def test_act_reports_http_status_and_body():
    with _Server(503, {"error": "overloaded"}) as url, pytest.raises(PolicyError, match="HTTP 503.*overloaded"):
        OpenAIChatPolicy(url, "m").act(MESSAGES, HARNESS, None)


def test_act_reports_a_body_that_is_not_json():
    with _Server(200, "<html>") as url, pytest.raises(PolicyError, match="not JSON"):
        OpenAIChatPolicy(url, "m").act(MESSAGES, HARNESS, None)


def test_connection_refused_is_a_policy_error():
    with _Server(200, COMPLETION) as url:
        pass  # server closed: nothing listens on the port any more
    with pytest.raises(PolicyError, match="POST http://127.0.0.1"):
        OpenAIChatPolicy(url, "m", timeout_s=2).act(MESSAGES, HARNESS, None)


def test_parse_reply_with_reasoning_field_and_no_tools():
    body = {"choices": [{"message": {"content": " 宝宝，这款到手价199元 ", "reasoning": "价格已查到"}}]}
    assert parse_chat_completion(body) == {"role": "assistant", "content": "宝宝，这款到手价199元", "reasoning_content": "价格已查到"}


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "response.choices"),
        ({"choices": [{}]}, "response.choices\\[0\\].message"),
        ({"choices": [{"message": {"content": 3}}]}, "message.content"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]}, "tool_calls\\[0\\].function.name"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}}]}, "tool_calls\\[0\\].function.arguments: not valid JSON"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}}]}, "arguments: expected a JSON object"),
    ],
)
def test_malformed_completion_names_the_field(body, field):
    with pytest.raises(PolicyError, match=field):
        parse_chat_completion(body)


def test_tool_message_without_a_pending_call_is_an_error():
    with pytest.raises(PolicyError, match=r"messages\[1\]: a tool message"):
        to_openai_messages([{"role": "user", "content": "x"}, {"role": "tool", "name": "f", "content": "{}"}])


def test_parallel_calls_pair_with_tool_messages_in_order():
    calls = [{"type": "function", "function": {"name": n, "arguments": {}}} for n in ("a", "b")]
    wire = to_openai_messages([{"role": "assistant", "content": "", "tool_calls": calls},
                               {"role": "tool", "name": "a", "content": "1"}, {"role": "tool", "name": "b", "content": "2"}])  # fmt: skip
    assert [m.get("tool_call_id") for m in wire] == [None, "call_0_0", "call_0_1"]
    assert OpenAIChatPolicy("http://h/v1", "m").with_seed(5).request_body([], HARNESS)["seed"] == 5
