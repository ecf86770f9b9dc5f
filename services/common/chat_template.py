"""Turn a list of chat messages into the prompt text a model was trained on.

Chat templates are Jinja code shipped inside model files, so they are untrusted:
they run in Jinja's immutable sandbox, which refuses underscore attributes (the
way out to Python internals) and any mutation of the data handed in. The
environment otherwise matches what Hugging Face's `apply_chat_template` offers
templates (trim_blocks, lstrip_blocks, loop controls, `raise_exception`,
`strftime_now`, a non-escaping `tojson`), so a template renders here exactly as
it does there.
"""

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ALLOWED_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})

# Used when a model ships no chat template: ChatML, the format most small
# instruction-tuned models (SmolLM2 among them) were trained on. It adds no
# default system prompt and no BOS.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """No prompt can be made: the conversation (client's fault) or the template (model's) is bad."""


def render_chat(
    template: str | None,
    messages: list[dict],
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    tools: list[dict] | None = None,
) -> str:
    """Render `messages` with `template`, or with FALLBACK_CHAT_TEMPLATE when it is None.

    Each message is a dict with a `role` from ALLOWED_ROLES, a string `content`
    and optionally a string `name`; other keys are passed through untouched.
    `tools` is what Hugging Face hands a template as `tools` (None for none).
    Raises ChatTemplateError for an invalid conversation and for any failure of
    the template itself: syntax errors, sandbox violations, `raise_exception`.
    """
    _validate(messages)
    compiled = _compile(template if template is not None else FALLBACK_CHAT_TEMPLATE)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            tools=tools,
        )
    except ChatTemplateError:
        raise
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"chat template tried an unsafe operation: {exc}") from exc
    # Template code is untrusted and may fail in any way Python can (TypeError on
    # 'a' + 1, RecursionError...); none of that may take down the server.
    except Exception as exc:
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def _validate(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{index}] must be an object")
        role = message.get("role")
        if role not in ALLOWED_ROLES:
            raise ChatTemplateError(
                f"messages[{index}].role is {role!r}; expected one of {sorted(ALLOWED_ROLES)}"
            )
        if not isinstance(message.get("content"), str):
            raise ChatTemplateError(f"messages[{index}].content must be a string")
        if "name" in message and not isinstance(message["name"], str):
            raise ChatTemplateError(f"messages[{index}].name must be a string")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template rejected the conversation: {message}")


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


# A server renders the same one or two templates for every request; parsing dominates rendering.
@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return _ENV.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template has a syntax error on line {exc.lineno}: {exc.message}"
        ) from exc
