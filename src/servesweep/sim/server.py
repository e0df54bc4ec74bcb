"""The simulated engine's OpenAI-compatible HTTP API (aiohttp).

Every response carries ``x-sim-instance: PID-STARTNS`` and generations carry it as
``system_fingerprint``, so a client can tell which process answered; a generation
also carries ``x-sim-request: INDEX``, its index in the truth file's ``generation``
lines.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from enum import Enum
from typing import Any

from aiohttp import web

from servesweep.sim.config import MODEL_MAX_LEN
from servesweep.sim.engine import Engine, Plan
from servesweep.sim.tokenizer import chat_prompt_text, token_ids

__all__ = ["SimServer", "State"]

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class State(str, Enum):
    LOADING = "loading"
    READY = "ready"
    SHUTTING_DOWN = "shutting_down"


def _error(status: int, message: str, type_: str) -> web.Response:
    body = {"object": "error", "message": message, "type": type_, "param": None, "code": status}
    return web.Response(status=status, text=_dumps(body), content_type="application/json")


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


class SimServer:
    """Routes and handlers; the process lifecycle (``process.py``) drives ``state``."""

    def __init__(
        self,
        engine: Engine,
        instance: str,
        on_generation: Callable[[int], None] | None = None,
    ) -> None:
        self.engine = engine
        self.model = engine.cfg.model
        self.instance = instance
        self.state = State.LOADING
        self.fail_during_shutdown = engine.cfg.shutdown_generation == "fail"
        self.on_generation = on_generation
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.on_response_prepare.append(self._stamp)
        return app

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-sim-instance"] = self.instance

    # -- simple endpoints ----------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "servesweep-sim",
            "root": self.model,
            "parent": None,
            # a longer context than the model holds is cut to it without a word
            "max_model_len": min(self.engine.cfg.max_model_len, MODEL_MAX_LEN),
            "sim_instance": self.instance,
        }
        return web.json_response({"object": "list", "data": [card]}, dumps=_dumps)

    async def health(self, request: web.Request) -> web.Response:
        if self.state is State.LOADING:
            return web.Response(status=503, text="loading")
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self.engine.metrics_text(), content_type="text/plain", charset="utf-8"
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if "messages" in body:
            text = chat_prompt_text(body["messages"])
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return _error(400, "tokenize needs 'prompt' (string) or 'messages'", "BadRequestError")
        ids = token_ids(text)
        return web.json_response(
            {"count": len(ids), "max_model_len": 4096, "tokens": ids}, dumps=_dumps
        )

    # -- generation ----------------------------------------------------------

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            return _error(400, f"invalid JSON body: {exc}", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "the JSON body must be an object", "BadRequestError")
        return body

    def _refuse(self, body: dict[str, Any]) -> web.Response | None:
        if self.state is State.LOADING:
            return _error(503, "the model is still loading", "ServiceUnavailableError")
        if self.state is State.SHUTTING_DOWN and self.fail_during_shutdown:
            return _error(503, "the server is shutting down", "ServiceUnavailableError")
        model = body.get("model")
        if model is not None and model != self.model:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        return None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival = asyncio.get_running_loop().time()
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            if prompt and all(isinstance(x, int) for x in prompt):
                prompt = " ".join(map(str, prompt))
            else:
                prompt = prompt[0] if prompt and isinstance(prompt[0], str) else ""
        if not isinstance(prompt, str):
            return _error(400, "'prompt' must be a string or a list", "BadRequestError")
        return await self._generate(request, body, prompt, False, arrival)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrival = asyncio.get_running_loop().time()
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty list", "BadRequestError")
        return await self._generate(request, body, chat_prompt_text(messages), True, arrival)

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt: str, chat: bool, arrival: float
    ) -> web.StreamResponse:
        """``arrival``: loop time at which the handler started (TTFT counts from it)."""
        refused = self._refuse(body)
        if refused is not None:
            return refused
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            return _error(400, "'max_tokens' must be a non-negative integer", "BadRequestError")
        engine = self.engine
        index = engine.next_index()
        if self.on_generation is not None:
            self.on_generation(index)
        if engine.fails(index):
            return _error(
                500, "simulated internal server error (--error-rate)", "InternalServerError"
            )
        plan = engine.plan(prompt, max_tokens, bool(body.get("ignore_eos", False)), index)
        if body.get("stream"):
            return await self._stream(request, body, plan, chat, arrival)
        pieces: list[str] = []

        async def collect(chunk: list[str]) -> None:
            pieces.extend(chunk)

        await engine.run(plan, collect, arrival)
        text = "".join(pieces)
        choice: dict[str, Any]
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": plan.finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": plan.finish_reason,
                "stop_reason": None,
            }
        result = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": self.instance,
            "choices": [choice],
            "usage": _usage(plan.prompt_tokens, len(pieces)),
        }
        return web.json_response(result, dumps=_dumps, headers={"x-sim-request": str(plan.index)})

    async def _stream(
        self, request: web.Request, body: dict[str, Any], plan: Plan, chat: bool, arrival: float
    ) -> web.StreamResponse:
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
        continuous = (
            bool(options.get("continuous_usage_stats")) if isinstance(options, dict) else False
        )
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-sim-request": str(plan.index),
            }
        )
        await resp.prepare(request)
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": self.instance,
        }
        prefix = _dumps(head)[:-1]  # the shared fields, without the closing brace
        total = len(plan.pieces)
        sent = 0

        def event(choices: list[dict[str, Any]], usage: dict[str, int] | None) -> bytes:
            tail = '"choices":' + _dumps(choices)
            if usage is not None:
                tail += ',"usage":' + _dumps(usage)
            return f"data: {prefix},{tail}}}\n\n".encode()

        async def emit(chunk: list[str]) -> None:
            nonlocal sent
            sent += len(chunk)
            finish = plan.finish_reason if sent >= total else None
            text = "".join(chunk)
            choice: dict[str, Any]
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice["finish_reason"] = finish
            choice["stop_reason"] = None
            usage = _usage(plan.prompt_tokens, sent) if continuous else None
            await resp.write(event([choice], usage))

        try:
            if chat:
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                role["finish_reason"] = None
                usage0 = _usage(plan.prompt_tokens, 0) if continuous else None
                await resp.write(event([role], usage0))
            await self.engine.run(plan, emit, arrival)
            if total == 0:
                empty: dict[str, Any] = (
                    {"index": 0, "delta": {}, "logprobs": None}
                    if chat
                    else {"index": 0, "text": "", "logprobs": None}
                )
                empty["finish_reason"] = plan.finish_reason
                await resp.write(event([empty], None))
            if include_usage:
                await resp.write(event([], _usage(plan.prompt_tokens, sent)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away; the engine has already freed the slot
        return resp
