"""A scripted OpenAI-compatible chat-completions server on loopback, for tests and benches.

OpenHands' agent loop runs inside the agent-server and calls its LLM with LiteLLM
(``LLM(model="openai/scripted", base_url=llm.base_url)``). This server answers the way a
model would, by a fixed script, so a whole conversation runs without any LLM service:

- a request without tools (the app server's conversation title) gets plain text;
- a request with tools gets a call of the terminal tool running ``command``; once the
  conversation holds that call's result it gets a call of ``finish``;
- ``"stream": true`` (the app server forces it) is answered with server-sent events
  (``chat.completion.chunk`` objects, then ``data: [DONE]``).

Every request body is kept in ``requests``, so a test can read the tool results the
agent-server sent back. Standard library only: it runs in any environment.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TERMINAL_NAMES = ("terminal", "execute_bash", "bash")
TITLE = "rollbox scripted conversation"


class ScriptedLLM:
    """``with ScriptedLLM("echo hi") as llm: ... llm.base_url ...``"""

    def __init__(self, command: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.command = command
        self.requests: list[dict[str, Any]] = []
        self.first_tool_result_at: float | None = None
        """``time.perf_counter()`` when a tool result first reached the LLM."""
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def tool_results(self) -> list[str]:
        """The text of every tool result the agent sent back, in order."""
        found: list[str] = []
        with self._lock:
            bodies = list(self.requests)
        for body in bodies:
            for message in body.get("messages", []):
                if message.get("role") == "tool":
                    text = _text(message.get("content"))
                    if text not in found:
                        found.append(text)
        return found

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message answering ``body``: text, or one tool call."""
        with self._lock:
            self.requests.append(body)
        tools = {t["function"]["name"]: t["function"] for t in body.get("tools") or []
                 if t.get("type") == "function"}
        if not tools:
            return {"role": "assistant", "content": TITLE}
        has_result = any(m.get("role") == "tool" for m in body.get("messages", []))
        if has_result and self.first_tool_result_at is None:
            self.first_tool_result_at = time.perf_counter()
        if not has_result:
            name = next((n for n in TERMINAL_NAMES if n in tools), None)
            if name is None:
                return {"role": "assistant", "content": f"no terminal tool in {sorted(tools)}"}
            arguments = _arguments(tools[name], {"command": self.command})
        else:
            name = "finish"
            arguments = _arguments(tools.get(name, {}), {"message": "done"})
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_" + uuid.uuid4().hex[:12], "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


def _arguments(function: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given``, plus a plausible value for every other required parameter."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    arguments = dict(given)
    for name in parameters.get("required") or []:
        if name in arguments:
            continue
        schema = properties.get(name) or {}
        if "enum" in schema:
            arguments[name] = "LOW" if "LOW" in schema["enum"] else schema["enum"][0]
        elif schema.get("type") == "boolean":
            arguments[name] = False
        elif schema.get("type") in ("integer", "number"):
            arguments[name] = 0
        else:
            arguments[name] = "rollbox"
    return arguments


def _completion(model: str, message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _chunks(model: str, message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    base = {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}
    calls = message.get("tool_calls")
    if calls:
        call = calls[0]
        yield {**base, "choices": [{"index": 0, "finish_reason": None, "delta": {
            "role": "assistant", "content": None, "tool_calls": [{
                "index": 0, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}]}}]}
        yield {**base, "choices": [{"index": 0, "finish_reason": None, "delta": {
            "tool_calls": [{"index": 0, "function": {
                "arguments": call["function"]["arguments"]}}]}}]}
        finish = "tool_calls"
    else:
        yield {**base, "choices": [{"index": 0, "finish_reason": None,
                                    "delta": {"role": "assistant", "content": ""}}]}
        yield {**base, "choices": [{"index": 0, "finish_reason": None,
                                    "delta": {"content": message["content"]}}]}
        finish = "stop"
    yield {**base, "choices": [{"index": 0, "finish_reason": finish, "delta": {}}]}
    yield {**base, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                                            "total_tokens": 15}}


def _handler(llm: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [
                    {"id": "scripted", "object": "model", "owned_by": "rollbox"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._json(400, {"error": {"message": "body is not JSON"}})
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            model = str(body.get("model") or "scripted")
            message = llm.reply(body)
            if not body.get("stream"):
                self._json(200, _completion(model, message))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in _chunks(model, message):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
