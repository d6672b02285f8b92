"""Our serving loop: the engine loop (thread and step), its scheduler (admission, chunked
prefill, memory fit, preemption), its verifier (lossless acceptance, log-probs) and its stats."""
