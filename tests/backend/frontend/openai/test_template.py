"""The checkpoint's chat template (backend/frontend/openai/template.py) renders as transformers does."""
from backend.frontend.openai.template import ChatTemplate


def test_chat_template_renders_as_the_tokenizer_does(checkpoint, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}]
    ours = ChatTemplate(checkpoint)
    for conv in (messages, messages[1:2]):
        expected = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert ours.render(conv) == expected
        ids = tokenizer.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert tokenizer(ours.render(conv)).input_ids == list(ids)  # what the model then tokenizes
