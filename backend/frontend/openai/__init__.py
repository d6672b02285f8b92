"""An OpenAI-compatible API on the HTTP edge: /v1/chat/completions, /v1/completions, /v1/models.

Mounted by backend/frontend/edge/proxy.py on the edge's port (8000); it speaks to Triton's `llm` model over
gRPC streaming with tritonclient's asyncio client, so every OpenAI request joins the same
continuously batched engine loop as the Triton protocols. A chat request's messages are
rendered with the served checkpoint's own chat template (`chat_template.jinja` or
`tokenizer_config.json`, of the checkpoint the launcher's served config names) and sent as the prompt.

A request's way: `parse.py` turns the body into a typed OpenAIRequest (or an ApiError naming the
field), `template.py` renders a chat's messages, `routes.py` sends it to Triton and `respond.py`
answers, whole or streamed, with `logprobs.py`'s shapes; `errors.py` is the one error path.

Supported: `messages` (system / developer / user / assistant; text content or text parts),
`prompt` (a string, or a list of one), `max_tokens` / `max_completion_tokens`, `temperature`
(default 1, as OpenAI), `top_p`, `presence_penalty` / `frequency_penalty` (-2..2), `seed`, `stop`, `n` (up to MAX_N: n requests in one batch,
seeds seed, seed+1, ... when a seed is given), `stream` with `stream_options.include_usage`,
`echo` (completions), `usage`, vLLM's `min_tokens` and `ignore_eos` (the engine's min_length),
`response_format` (chat: json_object, json_schema; the engine's guided decoding, backend/generation/guided.py),
`logprobs` (chat: true / false with `top_logprobs` 0..20;
completions: 0..5) in OpenAI's shapes, streaming or not: the log prob of each generated token under
the distribution it was sampled from and its most likely alternatives (the engine's
`return_log_probs` / `return_top_log_probs`), token strings by decoding each id alone. Anything else
is refused with an OpenAI-shaped error naming it (`logit_bias`, `tools`, ... are not served yet:
refused rather than ignored, so a client never gets output that silently disregards a setting).
Every error is OpenAI-shaped ({"error": {message, type, param, code}}), unknown /v1 routes and what the
edge refuses on /v1 (oversized headers, a body that does not match its Content-Encoding, a media type
other than application/json: backend/frontend/body_format.py) included; a stream Triton stops sending
ends with an error chunk and `data: [DONE]`. Those refused here, before Triton, are counted in the
edge's refusals (backend/frontend/metrics.py).
"""
