"""The OpenAI-compatible API as a bare ASGI app: /v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings, with
`stream: true` as Server-Sent Events ending in `data: [DONE]`. Served on --openai-port and under /v1 on the
HTTP port. Like every frontend it only translates: generation goes through Server.infer_stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceResponse
from nereid.frontends.http.disconnect import DisconnectWatch
from nereid.frontends.openai.embeddings import EmbeddingRequest, embedding_body, embedding_request, parse_embeddings
from nereid.frontends.openai.protocol import (
    CompletionState,
    OpenAIRequest,
    build_request,
    chat_logprobs,
    completion_logprobs,
    error_body,
    parse_chat,
    parse_completion,
    usage,
)
from nereid.server import Server

__all__ = ["OpenAIApp", "is_openai_path", "send_openai_error"]

log = logging.getLogger("nereid.openai")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


class _Disconnected(Exception):
    pass


class OpenAIApp:
    def __init__(self, server: Server) -> None:
        self.server = server

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # served with lifespan off: only HTTP scopes arrive
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await self.handle(scope["method"], scope["path"], body, receive, send)

    async def handle(self, method: str, path: str, body: bytes, receive: Receive, send: Send) -> None:
        """Answer one request whose body has been read (the HTTP frontend calls this for /v1 paths)."""
        try:
            path = path.rstrip("/")
            if path == "/v1/models" and method == "GET":
                await _reply(send, 200, orjson.dumps({"object": "list", "data": self._models()}))
            elif path.startswith("/v1/models/") and method == "GET":
                await self._model(path[len("/v1/models/") :], send)
            elif path == "/v1/completions" and method == "POST":
                await self._generate(parse_completion(body), receive, send)
            elif path == "/v1/chat/completions" and method == "POST":
                await self._generate(parse_chat(body), receive, send)
            elif path == "/v1/embeddings" and method == "POST":
                await self._embeddings(parse_embeddings(body), send)
            elif path in ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
                await _error(send, NereidError(Status.INVALID_ARG, f"method {method} is not allowed for {path}"), 405)
            else:
                await _error(send, NereidError.not_found(f"no OpenAI route {method} {path}"), 404)
        except NereidError as exc:
            await _error(send, exc)
        except _Disconnected:
            return
        except Exception as exc:  # never leave a client without an answer
            log.exception("unhandled error for %s %s", method, path)
            await _error(send, NereidError.internal(f"{type(exc).__name__}: {exc}"))

    # -- models ------------------------------------------------------------------------------------
    def _llm_versions(self) -> list[Any]:
        seen: dict[str, Any] = {}
        for mv in self.server.repository.ready_versions():
            config = mv.config
            inputs = {t.name for t in config.input}
            outputs = {t.name for t in config.output}
            if config.backend == "vllm" or ("text_input" in inputs and "text_output" in outputs and mv.decoupled):
                seen.setdefault(mv.name, mv)
        return list(seen.values())

    def _models(self) -> list[dict[str, Any]]:
        return [_model_entry(mv) for mv in self._llm_versions()]

    async def _model(self, name: str, send: Send) -> None:
        for mv in self._llm_versions():
            if mv.name == name:
                await _reply(send, 200, orjson.dumps(_model_entry(mv)))
                return
        raise NereidError.not_found(f"The model `{name}` does not exist.")

    async def _check_model(self, name: str) -> None:
        if any(mv.name == name for mv in self._llm_versions()):
            return
        if self.server.loads_on_demand:
            try:
                await self.server.wait_model(name)  # a model of the repository that is not loaded yet
            except NereidError as exc:
                if exc.status is not Status.NOT_FOUND:
                    raise
            if any(mv.name == name for mv in self._llm_versions()):
                return
        raise NereidError.not_found(f"The model `{name}` does not exist.")

    # -- embeddings --------------------------------------------------------------------------------
    async def _embeddings(self, req: EmbeddingRequest, send: Send) -> None:
        await self._check_model(req.model)

        async def one(index: int) -> InferenceResponse:
            final: InferenceResponse | None = None
            async for response in self.server.infer_stream(embedding_request(req, index)):
                if response.error is not None:
                    raise response.error
                final = response
            if final is None:
                raise NereidError.internal(f"model '{req.model}' gave no answer for input {index}")
            return final

        responses = await asyncio.gather(*(one(i) for i in range(len(req.inputs))))
        await _reply(send, 200, embedding_body(req, list(responses)))

    # -- generation --------------------------------------------------------------------------------
    async def _generate(self, req: OpenAIRequest, receive: Receive, send: Send) -> None:
        await self._check_model(req.model)
        streams = [self.server.infer_stream(build_request(req, i)) for i in range(len(req.prompts))]
        merged = _merge(streams)
        try:
            with DisconnectWatch(receive) as watch:
                # Errors before the first response (an unknown model, a prompt beyond the context) are plain
                # HTTP errors; after it they are an SSE error event.
                first = await anext(merged)
                if first[1].error is not None and first[1].final:
                    raise first[1].error
                if req.stream:
                    await self._stream(req, first, merged, send)
                else:
                    await self._whole(req, first, merged, send)
        finally:
            await merged.aclose()
        if watch.disconnected:
            raise _Disconnected()

    async def _whole(self, req: OpenAIRequest, first: tuple[int, InferenceResponse], rest: AsyncIterator[tuple[int, InferenceResponse]], send: Send) -> None:
        states = [CompletionState() for _ in req.prompts]
        entries: list[list[dict[str, Any]]] = [[] for _ in req.prompts]
        pending = len(req.prompts)
        item: tuple[int, InferenceResponse] | None = first
        while item is not None:
            index, response = item
            if response.error is not None:
                raise response.error
            _delta, lp = states[index].absorb(response)
            entries[index].extend(lp)
            if response.final:
                pending -= 1
            item = await anext(rest) if pending else None
        choices = []
        for i, state in enumerate(states):
            if req.kind == "chat":
                message: dict[str, Any] = {"role": "assistant", "content": state.text}
                if state.tool_calls:
                    message["tool_calls"] = state.tool_calls
                    message["content"] = state.text if state.text.strip() else None
                choice: dict[str, Any] = {
                    "index": i,
                    "message": message,
                    "logprobs": {"content": chat_logprobs(entries[i])} if req.logprobs is not None else None,
                    "finish_reason": state.finish_reason,
                }
            else:
                text = (req.prompts[i] + state.text) if req.echo else state.text
                logprobs = completion_logprobs(entries[i], len(req.prompts[i]) if req.echo else 0)[0] if req.logprobs is not None else None
                choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": state.finish_reason}
            choices.append(choice)
        body = {
            "id": _id(req),
            "object": "chat.completion" if req.kind == "chat" else "text_completion",
            "created": req.created,
            "model": req.model,
            "choices": choices,
            "usage": usage(states, req.n),
        }
        await _reply(send, 200, orjson.dumps(body))

    async def _stream(self, req: OpenAIRequest, first: tuple[int, InferenceResponse], rest: AsyncIterator[tuple[int, InferenceResponse]], send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        chat = req.kind == "chat"
        head = {"id": _id(req), "object": "chat.completion.chunk" if chat else "text_completion", "created": req.created, "model": req.model}
        states = [CompletionState() for _ in req.prompts]
        offsets = [0] * len(req.prompts)
        pending = len(req.prompts)

        async def event(payload: dict[str, Any]) -> None:
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(payload) + b"\n\n", "more_body": True})

        if chat:
            for i in range(len(req.prompts)):
                await event({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
        elif req.echo:
            for i, prompt in enumerate(req.prompts):
                offsets[i] = len(prompt)
                await event({**head, "choices": [{"index": i, "text": prompt, "logprobs": None, "finish_reason": None}]})
        item: tuple[int, InferenceResponse] | None = first
        try:
            while item is not None:
                index, response = item
                if response.error is not None:
                    error = response.error
                    await event(orjson.loads(error_body(error)[1]))
                    break
                state = states[index]
                delta, lp = state.absorb(response)
                finish = state.finish_reason if response.final else None
                # A token whose text is held back (half a UTF-8 character) still gets its chunk, as in vLLM.
                if delta or finish or lp or state.tool_deltas or not response.final:
                    if chat:
                        message: dict[str, Any] = {"content": delta} if delta or not (finish or state.tool_deltas) else {}
                        if state.tool_deltas:
                            message["tool_calls"] = state.tool_deltas
                        choice: dict[str, Any] = {
                            "index": index,
                            "delta": message,
                            "logprobs": {"content": chat_logprobs(lp)} if req.logprobs is not None else None,
                            "finish_reason": finish,
                        }
                    else:
                        logprobs = None
                        if req.logprobs is not None:
                            logprobs, offsets[index] = completion_logprobs(lp, offsets[index])
                        choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}
                    await event({**head, "choices": [choice]})
                if response.final:
                    pending -= 1
                item = await anext(rest) if pending else None
            if req.include_usage and pending == 0:
                await event({**head, "choices": [], "usage": usage(states, req.n)})
        except NereidError as exc:
            await event(orjson.loads(error_body(exc)[1]))
        await send({"type": "http.response.body", "body": _DONE, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _id(req: OpenAIRequest) -> str:
    return ("chatcmpl-" if req.kind == "chat" else "cmpl-") + req.id


def _model_entry(mv: Any) -> dict[str, Any]:
    return {"id": mv.name, "object": "model", "created": 0, "owned_by": "nereid", "root": mv.name, "parent": None}


async def _merge(streams: list[AsyncIterator[InferenceResponse]]) -> AsyncGenerator[tuple[int, InferenceResponse], None]:
    """(choice index, response) from several response streams, as they come; one stream is read directly."""
    if len(streams) == 1:
        try:
            async for response in streams[0]:
                yield 0, response
        finally:
            await streams[0].aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue[tuple[int, InferenceResponse | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[InferenceResponse]) -> None:
        try:
            async for response in stream:
                queue.put_nowait((index, response))
        except NereidError as exc:
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.get_running_loop().create_task(pump(i, s)) for i, s in enumerate(streams)]
    open_streams = len(streams)
    try:
        while open_streams:
            index, item = await queue.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _reply(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    head = _JSON + [(b"content-length", str(len(body)).encode())] + (headers or [])
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def send_openai_error(send: Send, error: NereidError) -> None:
    await _error(send, error)


async def _error(send: Send, error: NereidError, status: int | None = None) -> None:
    code, body = error_body(error)
    headers = None
    if error.retry_after is not None:
        # Refused for load (the model's waiting queue is full): OpenAI's clients back off and retry on a 429,
        # after the Retry-After seconds.
        code = 429
        body = orjson.dumps({"error": {"message": error.message, "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}})
        headers = [(b"retry-after", str(max(1, round(error.retry_after))).encode())]
    try:
        await _reply(send, status or code, body, headers)
    except RuntimeError:  # the response had already started (a stream): nothing more can be said
        pass
