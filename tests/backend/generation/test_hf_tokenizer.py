"""hf_tokenizer builds the tokenizer AutoTokenizer builds, without AutoTokenizer's model-config
import: the same class, init arguments and attributes on the served checkpoint, the same chat
template output; checkpoints whose class AutoTokenizer might choose otherwise go through it."""
import json
import shutil
import subprocess
import sys

import pytest

from backend.generation import hf_tokenizer


@pytest.fixture(scope="module")
def pair(checkpoint):
    from transformers import AutoTokenizer
    return hf_tokenizer.load(checkpoint), AutoTokenizer.from_pretrained(str(checkpoint))


def test_the_served_checkpoint_is_built_directly_and_equals_autotokenizers(pair, checkpoint):
    ours, auto = pair
    assert hf_tokenizer.names_its_own_class(checkpoint)
    assert type(ours) is type(auto)
    assert ours.init_kwargs == auto.init_kwargs
    assert vars(ours).keys() == vars(auto).keys()
    for key, value in vars(auto).items():
        assert repr(vars(ours)[key]) == repr(value), key
    assert ours.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 漢字"}]
    for generation_prompt in (True, False):
        assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
                == auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt))


def test_autotokenizer_keeps_the_declared_class_for_the_direct_model_types():
    """The installed transformers' override lists: a model type in them would make AutoTokenizer
    choose another class than the one tokenizer_config.json declares."""
    from transformers.models.auto import tokenization_auto as auto

    for model_type in hf_tokenizer.DIRECT_MODEL_TYPES:
        assert model_type not in auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
        assert (auto.TOKENIZER_MAPPING_NAMES.get(model_type) or "").removesuffix("Fast") != "MistralCommonBackend"


@pytest.mark.parametrize("change", ["model_type", "auto_map", "tokenizer_class"])
def test_other_checkpoints_go_through_autotokenizer(tmp_path, checkpoint, change):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(checkpoint / name, tmp_path / name)
    target = tmp_path / ("config.json" if change == "model_type" else "tokenizer_config.json")
    data = json.loads(target.read_text())
    data.update({"model_type": "mistral"} if change == "model_type" else
                {"auto_map": {"AutoTokenizer": ["x.Y", None]}} if change == "auto_map" else
                {"tokenizer_class": "GPT2Tokenizer"})
    target.write_text(json.dumps(data))
    assert not hf_tokenizer.names_its_own_class(tmp_path)


def test_the_direct_path_does_not_load_the_model_config():
    """What makes it cheaper: transformers' model-config modules stay unimported."""
    code = ("import sys; from backend.generation import hf_tokenizer; from tests.conftest import CHECKPOINT; "
            "hf_tokenizer.load(CHECKPOINT); "
            "print(any(m.startswith('transformers.models.llama') for m in sys.modules), "
            "'transformers.integrations.hub_kernels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
