"""A real OpenAI-compatible chat-completions server on loopback, serving scripted replies.

Test infrastructure, not a mock of our code: the `openai` SDK talks real HTTP to it. It speaks
`POST /v1/chat/completions` and `GET /v1/models`, answers each completion with the next scripted
reply, and records every request (path, headers, JSON body) for the test to inspect.

A scripted reply is a string (the assistant's content), or a dict with `content` and optionally
`finish_reason`, `tool_calls` (a list of `{"name", "arguments"}`, the arguments a dict, sent as
its JSON, or a string, sent as it is) and `usage` (replaces the counted usage), or
`{"status": 401, "message": ...}` for an HTTP error. With no reply left the
server answers 400 (the SDK does not retry that), so a test that under-scripts fails fast.

For concurrent clients, whose request order is not fixed, `responder(body) -> reply` answers each
request from its content instead of the script. `POST /v1/load_lora_adapter` behaves as vLLM's
runtime LoRA endpoint: it records the adapter (200), answers 400 for a name already loaded or a
path without adapter_config.json, and a loaded adapter is then listed by `/v1/models` and
accepted as a completion's `model`.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class ChatServer:
    """`with ChatServer(["reply", ...]) as server:` serves on `server.url` (ends in /v1)."""

    def __init__(self, replies: Iterable[str | dict[str, Any]] = (), model: str = "test-model",
                 responder: Callable[[dict[str, Any]], str | dict[str, Any]] | None = None):
        self.model = model
        self.responder = responder
        self.adapters: dict[str, str] = {}  # lora_name -> lora_path, as loaded at runtime
        self.replies: deque[str | dict[str, Any]] = deque(replies)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add(self, *replies: str | dict[str, Any]) -> None:
        with self._lock:
            self.replies.extend(replies)

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def completions(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat-completion requests, in order."""
        return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    def __enter__(self) -> ChatServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="chat-server", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    # -------------------------------------------------------- serving

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        with self._lock:
            self.requests.append({"method": handler.command, "path": handler.path,
                                  "headers": {k.lower(): v for k, v in handler.headers.items()},
                                  "body": body})

    def _next_reply(self, body: dict[str, Any]) -> str | dict[str, Any] | None:
        if self.responder is not None:
            return self.responder(body)
        with self._lock:
            return self.replies.popleft() if self.replies else None

    def load_adapter(self, body: dict[str, Any]) -> tuple[int, str]:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return 400, "lora_name and lora_path are required"
        with self._lock:
            if name in self.adapters:
                return 400, f"The lora adapter '{name}' has already been loaded."
            if not (Path(path) / "adapter_config.json").is_file():
                return 400, f"No adapter found at {path}"
            self.adapters[name] = path
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def completion(self, body: dict[str, Any], reply: str | dict[str, Any]) -> dict[str, Any]:
        content = reply if isinstance(reply, str) else reply.get("content")
        calls = [] if isinstance(reply, str) else list(reply.get("tool_calls") or [])
        finish = "stop" if isinstance(reply, str) else reply.get("finish_reason", "tool_calls" if calls else "stop")
        prompt_words = sum(len(str(m.get("content") or "").split()) for m in body.get("messages", []))
        completion_words = len((content or "").split())
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"id": f"call_{next(self._ids)}", "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
                              else json.dumps(c["arguments"])}} for c in calls]
        usage = {"prompt_tokens": prompt_words, "completion_tokens": completion_words,
                 "total_tokens": prompt_words + completion_words}
        if not isinstance(reply, str) and reply.get("usage"):
            usage = dict(reply["usage"])
        return {
            "id": f"chatcmpl-test-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": usage,
        }


def _handler(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's httpx client expects

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})

        def do_GET(self) -> None:
            server._record(self, None)
            if self.path.rstrip("/") == "/v1/models":
                names = [server.model, *server.adapters]
                self._send(200, {"object": "list", "data": [
                    {"id": n, "object": "model", "created": 0, "owned_by": "evotrainer-tests"} for n in names]})
            else:
                self._error(404, f"no route {self.path}", "not_found_error")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                server._record(self, raw.decode(errors="replace"))
                return self._error(400, "request body is not JSON")
            server._record(self, body)
            if self.path.rstrip("/") == "/v1/load_lora_adapter":
                status, text = server.load_adapter(body)
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._error(404, f"no route {self.path}", "not_found_error")
            if not isinstance(body.get("messages"), list) or not body.get("model"):
                return self._error(400, "model and messages are required")
            if body.get("stream"):
                return self._error(400, "this test server does not stream")
            if server.adapters and body["model"] not in (server.model, *server.adapters):
                return self._error(404, f"The model `{body['model']}` does not exist.", "not_found_error")
            reply = server._next_reply(body)
            if reply is None:
                return self._error(400, "the test server has no scripted reply left")
            if isinstance(reply, dict) and "status" in reply:
                return self._error(int(reply["status"]), str(reply.get("message", "scripted error")),
                                   str(reply.get("type", "api_error")))
            self._send(200, server.completion(body, reply))

    return Handler
