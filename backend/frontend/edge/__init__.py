"""The HTTP edge: the one HTTP port clients reach; Triton's own HTTP listens behind it on a
Unix socket no other local user can reach (started by backend/frontend/supervisor/), every API
of it closed to requests without the per-start key the edge adds (INTERNAL_HEADER).

Triton 2.51's HTTP front end has no request-size or nesting limit, and dies (SIGSEGV) on some
bodies of about 4 MiB and on JSON nested 40,000 deep (issue 20), and it answers 500 for
client mistakes it finds while parsing (malformed JSON, wrong JSON types). So before anything
reaches Triton the edge

- refuses a body over `max_body_bytes` (413, also once its Content-Encoding is undone), JSON
  nested deeper than `max_depth` or holding a lone UTF-16 surrogate (400), a body that does not
  match its Content-Encoding (400), a content coding or media type the interface does not take, a
  body in UTF-16 (415; backend/frontend/body_format.py), headers over MAX_HEADER_BYTES (431), and a
  client slower than `read_timeout_s` to send its headers (the connection is closed) or its body
  (408, and closed), each in the interface's own error shape (refusal);
- on the generate endpoints and /infer, refuses what Triton would answer 500 for or silently
  wrap (a body that is not a JSON object, `inputs` that is no array, a negative or fractional
  shape, a value of the wrong JSON type, an integer outside its tensor type such as max_tokens
  2^32+8, which INT32 would wrap to 8) with 400 naming the field, a generate field that is no
  input of the model (Triton would pass it on as a parameter the model never reads), as Triton
  itself refuses an unknown input on /infer and gRPC, and `stream: true` on /generate (Triton
  answers 200 with an error body: streaming is /generate_stream's);
- answers HEAD with what GET would, without the body (Triton 2.51 drops HEAD connections);
- sends /infer on the decoupled models (llm, ensemble, tensorrt_llm_bls; tensorrt_llm), which Triton refuses
  with 501, to their unary twins llm_unary / tensorrt_llm_unary (model_repository/) on the same engine;
- gives the model's own errors their status: Triton 2.51 answers 400 for every error a
  decoupled model sends, so "server overloaded" becomes 503 (with Retry-After) and
  "internal error" 500;
- passes everything else through unchanged, streaming included (a client that disconnects
  closes the upstream connection, which cancels its request; a stream Triton stops sending, say
  because it crashed, ends with an error event, not a cut);
- tells the model when a client leaves before its response is complete (CancelMarks): Triton
  2.51's HTTP front end notices only when it next writes to it, so a request still waiting in
  the queue, or a /generate still generating, would otherwise run to its end.
"""

