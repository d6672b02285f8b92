"""A checkpoint's full transformers tokenizer (chat template, llguidance's vocabulary, logprob
bytes), the object `AutoTokenizer.from_pretrained` returns, ~3 s sooner each time a server starts.

AutoTokenizer first loads the checkpoint's model config only to choose the tokenizer class, and
that config import pulls in half of transformers (hub kernels, torch.distributed): 2.6 s of a
4.1 s load on a 2-core machine, every llm start. For a checkpoint whose tokenizer_config.json
names `TokenizersBackend` itself (what transformers 5 writes; set-up's prepared checkpoints) and
asks for no remote code, AutoTokenizer's choice is that class unless the model type is one
transformers overrides (its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, or a Mistral-format
checkpoint): for the Llama family we serve it is, so we build that class directly. Anything else
goes through AutoTokenizer. tests/backend/generation/test_hf_tokenizer.py holds the result equal to
AutoTokenizer's (class, init arguments, every attribute) on the served checkpoint, and checks the
override lists of the installed transformers still leave "llama" alone.
"""
from __future__ import annotations

import json
from pathlib import Path

DIRECT_MODEL_TYPES = frozenset({"llama"})  # model types whose hub-declared class AutoTokenizer keeps


def read_json(path: Path) -> dict:
    """A checkpoint's JSON file, {} where it has none."""
    return json.loads(path.read_text()) if path.is_file() else {}


def names_its_own_class(checkpoint: Path) -> bool:
    """Whether AutoTokenizer would build TokenizersBackend for this checkpoint without a
    question its model config answers differently."""
    tokenizer_config = read_json(checkpoint / "tokenizer_config.json")
    return (tokenizer_config.get("tokenizer_class") == "TokenizersBackend"
            and "auto_map" not in tokenizer_config
            and (checkpoint / "tokenizer.json").is_file()
            and read_json(checkpoint / "config.json").get("model_type") in DIRECT_MODEL_TYPES)


def load(checkpoint) -> "transformers.PreTrainedTokenizerBase":  # noqa: F821
    checkpoint = Path(checkpoint)
    if names_its_own_class(checkpoint):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(checkpoint), _from_auto=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint))
