"""The OpenAI API's routes (backend/frontend/openai/routes.py), without Triton."""
import asyncio

from aiohttp import web

from backend.frontend.openai.routes import OpenAIApi
from backend.server_config import ServerConfig


MSG = [{"role": "user", "content": "hi"}]


def test_the_default_length_is_the_launchers_record_not_tritons_model_config():
    """ignore_eos without max_tokens needs the server's default: the OpenAI API takes it from the
    served config the launcher resolved (ServerConfig.max_new_tokens, where the adapter takes it
    too), never fetching Triton's model config for it."""
    class Edge:
        async def read_json(self, request):
            return {"model": "llm", "messages": MSG, "ignore_eos": True}

        async def model_config(self, model):
            raise AssertionError("the OpenAI API asked Triton for its model config")

    api, sent = OpenAIApi(Edge(), "127.0.0.1:1", ServerConfig(default_max_tokens=7)), []

    async def run(request, req, prompt):
        sent.append(req)
        return web.Response()
    api._run = run
    asyncio.run(api.chat(None))
    assert (sent[0].max_tokens, sent[0].min_length) == (7, 7)


def test_one_error_path_counts_only_what_never_reached_the_model():
    """A fault of ours and an unreachable Triton are the edge's refusals (counted); the model's own
    errors are counted by Triton and the model, not again here."""
    from backend.frontend.openai.errors import UpstreamGone, model_error
    counted = []

    class Edge:
        class refusals:
            @staticmethod
            def count(api, status, code):
                counted.append((api, status))

    api = OpenAIApi(Edge(), "127.0.0.1:1", ServerConfig())

    async def fail(e, doing=""):
        return await api._failed(None, e, doing)

    ours = asyncio.run(fail(RuntimeError("boom"), "rendering the chat template"))
    theirs = asyncio.run(fail(model_error("server overloaded: 3 requests are waiting; retry later")))
    gone = asyncio.run(fail(UpstreamGone(False)))
    assert (ours.status, theirs.status, gone.status) == (500, 503, 503)
    assert b"while rendering the chat template" in ours.body and gone.headers["Retry-After"] == "1"
    assert counted == [("openai", 500), ("openai", 503)]


def test_the_triton_channel_reconnects_within_a_second_and_keeps_tritonclients_defaults():
    """gRPC's own reconnect backoff grows to 120 s while Triton is down: after a long restart the
    API would answer "not reachable" long after Triton is ready again."""
    from backend.frontend.openai.routes import triton_channel_args
    args = dict(triton_channel_args())
    assert args["grpc.max_reconnect_backoff_ms"] <= 1000
    assert args["grpc.initial_reconnect_backoff_ms"] <= args["grpc.max_reconnect_backoff_ms"]
    for name in ("grpc.max_send_message_length", "grpc.max_receive_message_length", "grpc.keepalive_time_ms",
                 "grpc.keepalive_timeout_ms", "grpc.keepalive_permit_without_calls", "grpc.http2.max_pings_without_data"):
        assert name in args, name
