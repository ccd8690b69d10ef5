"""A scripted OpenAI-compatible chat server: a TEST DOUBLE of an LLM endpoint, not a model.

It answers `/v1/chat/completions` (streaming and not) with the scripted policy's next reply for the task named
in the conversation, so `vf-eval`, prime-rl-style clients and `air eval` can run end to end offline. A request
that offers `tools` is answered in the tools format: the story's action as one tool call (`tool_calls`, finish
reason `tool_calls`; streamed as OpenAI streams calls), its thought as the text.

    python -m air.policies.scripted_server --port 8765      # or --port 0 --port-file F (picks a free port)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path

from aiohttp import web

from air.actions import Reply
from air.policies.scripted import SCRIPTS, SUBMIT_TURN, TRIVIAL, VALIDATE_TURN, Script, ScriptedPolicy, _bash

MODEL = "air-scripted"


def make_app(policy: ScriptedPolicy | None = None) -> web.Application:
    policy = policy or ScriptedPolicy()
    app = web.Application(client_max_size=64 << 20)
    app["requests"] = 0

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        request.app["requests"] += 1
        messages, tools = body.get("messages") or [], body.get("tools")
        reply = policy.tool_reply_for(messages, tools) if tools else Reply(content=policy.reply_for(messages))
        text = reply.content or ""
        calls = [call.message() for call in reply.tool_calls]
        finish = "tool_calls" if calls else "stop"
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        model = body.get("model") or MODEL
        size = max((len(text) + sum(len(c["function"]["arguments"]) for c in calls)) // 4, 1)
        usage = {"prompt_tokens": 1, "completion_tokens": size, "total_tokens": 1 + size}
        if not body.get("stream"):
            return web.json_response({
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": reply.message() | {"content": reply.content if calls else text},
                             "finish_reason": finish}],
                "usage": usage,
            })
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(chunk: dict) -> None:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": reply.content
                                                               if calls else text}, "finish_reason": None}]})
        if calls:
            await send({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, **call} for i, call in enumerate(calls)]}, "finish_reason": None}]})
        await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({**base, "choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    return app


def stories(path: Path) -> dict[str, Script]:
    """A test's own stories, `{"task id": ["command", ...]}`: each command a bash turn, then validate and submit
    (a task without a script of air's, e.g. a Harbor task a test brings); ValueError (one line) otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--stories {path}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) and all(isinstance(c, str) for c in v)
                                              for v in data.values()):
        raise ValueError(f"--stories {path}: not a mapping of task ids to lists of commands")
    return {task: Script(turns=(*(_bash(c) for c in commands), VALIDATE_TURN, SUBMIT_TURN))
            for task, commands in data.items()}


async def serve(port: int, port_file: Path | None = None, trivial: bool = False,
                scripts: dict[str, Script] | None = None) -> None:
    policy = ScriptedPolicy(only=TRIVIAL) if trivial else ScriptedPolicy({**SCRIPTS, **scripts}) if scripts else None
    runner = web.AppRunner(make_app(policy))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    if port_file:
        port_file.write_text(str(bound))
    print(f"scripted policy server (a test double, not a model) on http://127.0.0.1:{bound}/v1", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--trivial", action="store_true", help="answer every task with 40 turns of `true`")
    parser.add_argument("--stories", type=Path, help='JSON {"task id": ["command", ...]}: stories of your own '
                        "(each command, then validate and submit)")
    args = parser.parse_args()
    try:
        scripts = stories(args.stories) if args.stories else None
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(serve(args.port, args.port_file, args.trivial, scripts))


if __name__ == "__main__":
    main()
