"""The checkpoint's chat template, rendered as transformers does (sandboxed jinja2)."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import ApiError


class ChatTemplate:
    """The checkpoint's chat template, rendered as transformers does (sandboxed jinja2)."""

    def __init__(self, checkpoint: Path):
        cfg_path = checkpoint / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        source = (checkpoint / "chat_template.jinja").read_text() if (checkpoint / "chat_template.jinja").exists() \
            else cfg.get("chat_template")
        if not source:
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ApiError(400, f"the chat template refused these messages: {message}", "messages")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
        self.template = env.from_string(source)
        self.tokens = {k: cfg.get(k) if isinstance(cfg.get(k), str) else "" for k in ("bos_token", "eos_token")}

    def render(self, messages: list) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True, **self.tokens)
