"""A scripted OpenAI-compatible chat-completions server on a loopback thread, for the deploy fault tests.

Modes (how every POST /v1/chat/completions is answered, streamed as SSE like `transformers serve`):
- "reply": a role chunk, `REPLY` in three content deltas, a finish chunk with usage.
- "text_tool": on the viewer's turn a `<tool_call>` for `search_products` as content text, after tool
  results the reply (the model's format; the client parses it).
- "server_tool": the same call as a server-parsed `delta.tool_calls` in fragments (name, then the
  argument text in two pieces), a usage-only chunk and `[DONE]`, then the reply.
- "always_tool": a tool call on every turn.
- "human_claim": a reply the production Stop hook blocks ("我是真人").
- "malformed": a role chunk, then an event that is not JSON.
- "empty": a role chunk, `{}` with finish "stop", then `[DONE]`: a turn with no content, reasoning or call.
- "stall": a role chunk, then silence for `stall_s` seconds.
- "die_after": `die_after` requests as "reply", then a role chunk, the listener shut down and the
  connection dropped mid-stream: later requests are refused.
GET /v1/models lists `model`; a request for another model gets HTTP 400 with a JSON body.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = "宝宝，这款在直播间有现货，详情以商品页为准哦。"
TOOL_TEXT = "<tool_call>\n<function=search_products>\n<parameter=query>\n连衣裙\n</parameter>\n</function>\n</tool_call>"


def _chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    choice = {"index": 0, "delta": delta}
    if finish:
        choice["finish_reason"] = finish
    body = {"id": "fake", "object": "chat.completion.chunk", "model": "fake", "choices": [choice]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()


class FakeChatServer:
    """The server; use as a context manager. Attributes: base_url, posts (chat requests received)."""

    def __init__(self, mode: str = "reply", model: str = "fake-model", stall_s: float = 3.0, die_after: int = 2):
        self.mode, self.model, self.stall_s, self.die_after = mode, model, stall_s, die_after
        self.posts = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._json(404, {"detail": "Not Found"})
                if body.get("model") != fake.model:
                    return self._json(400, {"detail": f"model {body.get('model')!r} is not served here"})
                with fake._lock:
                    fake.posts += 1
                    count = fake.posts
                fake._stream(self, body, count)

            def _json(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._stopped = False

    def _stream(self, handler: BaseHTTPRequestHandler, body: dict, count: int) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        w = handler.wfile
        w.write(_chunk({"role": "assistant"}))
        w.flush()
        after_tools = body["messages"][-1]["role"] == "tool"
        mode = self.mode
        if mode == "malformed":
            w.write(b"data: {this is not json\n\n")
            return
        if mode == "stall":
            time.sleep(self.stall_s)
            return
        if mode == "empty":
            w.write(_chunk({}, "stop"))
            w.write(b"data: [DONE]\n\n")
            return
        if mode == "die_after" and count > self.die_after:
            self.stop()
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "always_tool" or (mode in ("text_tool", "server_tool") and not after_tools):
            if mode == "server_tool":  # the call in fragments, as vLLM streams it, then a usage-only chunk
                args = json.dumps({"query": "连衣裙"}, ensure_ascii=False)
                w.write(b": keep-alive\n\n")
                w.write(_chunk({"reasoning_content": "查一下商品"}))
                w.write(_chunk({"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                                                "function": {"name": "search_products", "arguments": ""}}]}))
                for piece in (args[:5], args[5:]):
                    w.write(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
                w.write(_chunk({}, "tool_calls"))
                usage = {"completion_tokens": 12, "prompt_tokens": 5, "total_tokens": 17}
                w.write(f"data: {json.dumps({'id': 'fake', 'choices': [], 'usage': usage})}\n\n".encode())
            else:
                w.write(_chunk({"reasoning_content": "查一下商品"}))
                w.write(_chunk({"content": TOOL_TEXT}))
                w.write(_chunk({}, "stop", {"completion_tokens": 30, "prompt_tokens": 5, "total_tokens": 35}))
            w.write(b"data: [DONE]\n\n")
            return
        text = "宝宝，我是真人主播哦，这款有货。" if mode == "human_claim" else REPLY
        w.write(_chunk({"reasoning_content": "直接回答"}))
        for part in (text[:5], text[5:12], text[12:]):
            w.write(_chunk({"content": part}))
            w.flush()
            time.sleep(0.005)
        w.write(_chunk({}, "stop", {"completion_tokens": 9, "prompt_tokens": 5, "total_tokens": 14}))

    def start(self) -> FakeChatServer:
        """Starts serving on the loopback thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving and closes the listener (later connections are refused)."""
        if not self._stopped:
            self._stopped = True
            if self._thread.is_alive():
                self._server.shutdown()  # waits for the serve loop (not this thread) to exit
            self._server.server_close()

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
