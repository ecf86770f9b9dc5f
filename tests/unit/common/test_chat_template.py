from datetime import datetime

import pytest

from maas_services.common.chat_template import (
    FALLBACK_CHAT_TEMPLATE,
    ChatTemplateError,
    render_chat,
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"},
    ],
    [
        {"role": "system", "content": "Réponds en français.\nSois bref."},
        {"role": "user", "content": "  leading and trailing spaces  \n"},
        {"role": "assistant", "content": "D'accord 😀 你好"},
        {"role": "user", "content": "Code:\n```py\ndef f():\n    return 1\n```"},
    ],
    [{"role": "user", "content": ""}],
]


def _render(tokenizer, messages, add_generation_prompt=True):
    return render_chat(
        tokenizer.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
    )


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_transformers(tokenizer, hf_tokenizer, messages, add_generation_prompt):
    expected = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert _render(tokenizer, messages, add_generation_prompt) == expected


def test_default_system_prompt_only_without_system_message(tokenizer):
    default = "You are a helpful AI assistant named SmolLM"
    assert default in _render(tokenizer, [{"role": "user", "content": "Hi"}])
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert default not in _render(tokenizer, with_system)


def test_rendered_prompt_ends_ready_for_the_assistant(tokenizer):
    prompt = _render(tokenizer, CONVERSATIONS[0])
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(prompt)
    assert ids.count(tokenizer.bos_token_id) == 3


def test_fallback_is_chatml_without_default_system_prompt():
    messages = [{"role": "user", "content": "Hi"}]
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(None, messages) == expected
    assert render_chat(FALLBACK_CHAT_TEMPLATE, messages, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_template_sees_special_tokens_and_extra_keys():
    template = "{{ bos_token }}{% for m in messages %}{{ m.name }}:{{ m.content }}{% endfor %}"
    template += "{{ eos_token }}"
    messages = [{"role": "user", "content": "hey", "name": "ann"}]
    assert render_chat(template, messages, bos_token="<s>", eos_token="</s>") == "<s>ann:hey</s>"


def test_helpers_hugging_face_templates_rely_on():
    messages = [{"role": "user", "content": "<b>é</b>"}]
    assert render_chat("{{ messages[0].content | tojson }}", messages) == '"<b>é</b>"'
    assert render_chat("{{ strftime_now('%Y') }}", messages) == str(datetime.now().year)
    loop = "{% for m in messages %}{% if loop.first %}{% break %}{% endif %}x{% endfor %}done"
    assert render_chat(loop, messages) == "done"


def test_trim_and_lstrip_blocks_like_hugging_face():
    template = "  {% for m in messages %}\n{{ m.content }}\n  {% endfor %}\n"
    assert render_chat(template, [{"role": "user", "content": "a"}]) == "a\n"


MALICIOUS_TEMPLATES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__subclasses__() }}",
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ raise_exception.__globals__['os'].system('id') }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}",
    "{% set _ = messages[0].update({'content': 'pwned'}) %}",
]


@pytest.mark.parametrize("template", MALICIOUS_TEMPLATES)
def test_sandbox_escapes_are_refused(template):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render_chat(template, messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_unsafe_attribute_renders_nothing():
    assert render_chat("{{ ''.__class__ }}", [{"role": "user", "content": "hi"}]) == ""


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ raise_exception('Only user and assistant roles') }}", "Only user and assistant roles"),
        ("{% for %}", "syntax error"),
        ("{{ 1 + 'a' }}", "TypeError"),
        ("{{ messages[5].content.upper() }}", "chat template failed"),
    ],
)
def test_template_failures_become_chat_template_errors(template, message):
    with pytest.raises(ChatTemplateError, match=message):
        render_chat(template, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([{"role": "wizard", "content": "hi"}], "role"),
        ([{"content": "hi"}], "role"),
        ([{"role": "user", "content": None}], "content"),
        ([{"role": "user"}], "content"),
        ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "content"),
        ([{"role": "user", "content": "hi", "name": 3}], "name"),
        (["hi"], "object"),
        ([], "non-empty"),
        ({"role": "user", "content": "hi"}, "list"),
    ],
)
def test_invalid_conversations_are_refused(tokenizer, messages, message):
    with pytest.raises(ChatTemplateError, match=message) as raised:
        _render(tokenizer, messages)
    assert isinstance(raised.value, ValueError)


def test_every_allowed_role_renders(tokenizer):
    roles = ["system", "developer", "user", "assistant", "tool"]
    prompt = _render(tokenizer, [{"role": role, "content": role} for role in roles])
    for role in roles:
        assert f"<|im_start|>{role}\n{role}<|im_end|>" in prompt
