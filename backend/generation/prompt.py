"""A request's prompt as token ids, torch-free: llm's intake and the `preprocessing` model
tokenize text through the same function, so both paths see the same ids."""
from __future__ import annotations

from .errors import RequestError


def text_ids(tokenizer, text: str) -> list:
    """Raw text as the model's tokenizer encodes it, special tokens (if the tokenizer adds any) included."""
    return list(tokenizer(text).input_ids)


def prompt_ids(tokenizer, req) -> list:
    """The request's prompt as token ids: given (input_ids), raw, or as a user turn in the model's
    chat template. `req` is a GenerationRequest (any object with input_ids, prompt and
    apply_chat_template)."""
    if req.input_ids is not None:
        return list(req.input_ids)
    if req.apply_chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise RequestError("this model has no chat template; send apply_chat_template=false")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": req.prompt}], tokenize=True,
                                            add_generation_prompt=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return text_ids(tokenizer, req.prompt)


def decode_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
