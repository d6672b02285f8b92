"""text_tokenizer answers as transformers' tokenizer does, on the served checkpoint: what the
token models (preprocessing, postprocessing) ask of it, over texts and id sequences that reach
the special and added tokens, whitespace, accents and multi-byte characters."""
import json
import random
import sys
import subprocess

import pytest

from backend.generation import text_tokenizer
from backend.generation.prompt import text_ids

TEXTS = ["Hello  world . ", "<|im_start|>user\nhi<|im_end|>\n", " héllo ,  it 's 漢字 🙂\t\n\n",
         "<|endoftext|><repo_name>x<file_sep>", "", " ", "a" * 300, "def f(x):\n    return x**2  # ∑\r\n",
         "Ünïcödé — “quotes” and ‘more’", "1234567890 3.14159 -0.5e10"]


@pytest.fixture(scope="module")
def pair(checkpoint):
    from transformers import AutoTokenizer
    return text_tokenizer.load(checkpoint), AutoTokenizer.from_pretrained(str(checkpoint))


def test_the_served_checkpoint_takes_the_fast_path(pair):
    assert isinstance(pair[0], text_tokenizer.TextTokenizer)


def test_ids_vocabulary_and_special_ids_equal_transformers(pair):
    ours, hf = pair
    assert (ours.eos_token_id, ours.pad_token_id, len(ours)) == (hf.eos_token_id, hf.pad_token_id, len(hf))
    for text in TEXTS:
        assert text_ids(ours, text) == text_ids(hf, text), text
        assert ours(text, add_special_tokens=False).input_ids == hf(text, add_special_tokens=False).input_ids, text


def test_decoding_equals_transformers(pair):
    ours, hf = pair
    rng = random.Random(7)
    special = list(range(0, 20))  # SmolLM2's added tokens (<|endoftext|>, <|im_start|>, <repo_name>, ...)
    sequences = [hf(t).input_ids for t in TEXTS]
    sequences += [[rng.randrange(len(hf)) for _ in range(rng.randrange(1, 40))] + rng.sample(special, 3)
                  for _ in range(200)]
    for ids in sequences:
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids


def test_a_config_rewriting_spaces_falls_back_to_transformers(tmp_path, checkpoint):
    """clean_up_tokenization_spaces makes transformers edit decoded text: not reproduced, so not taken."""
    for name in ("tokenizer.json", "special_tokens_map.json"):
        if (checkpoint / name).exists():
            (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    assert not isinstance(text_tokenizer.load(tmp_path), text_tokenizer.TextTokenizer)


def test_the_token_models_import_neither_torch_nor_transformers(tmp_path):
    """Why the module exists: each of these Triton stubs loads in well under a second."""
    (tmp_path / "triton_python_backend_utils.py").write_text("TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1\n")
    code = ("import sys; import backend.frontend.triton_models.tokens; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{tmp_path}:{text_tokenizer.__file__.rsplit('/backend/', 1)[0]}"})
    assert out.stdout.strip() == "[]"
