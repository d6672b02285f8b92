"""What clients and Triton talk to, in four wings: the supervisor that launches and watches Triton
(supervisor/), the HTTP edge (edge/), the OpenAI API it mounts (openai/) and Triton's models
(triton_models/); at the top what they share: request bodies (body_format.py, http_body.py) and
the metrics (metrics.py, read back by prometheus_text.py)."""
