"""The context-length rule, shared by the tokenizer service and the engine.

Messages follow OpenAI's wording ("This model's maximum context length is ..."),
which clients and SDKs match on, and name both numbers so a client can trim the
right part.
"""


class ContextLengthError(ValueError):
    pass


def _refuse(max_model_len: int, prompt: str, max_tokens: int, total: str) -> ContextLengthError:
    return ContextLengthError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{total} tokens ({prompt} in the prompt, {max(max_tokens, 0)} for the completion). "
        "Please reduce the length of the prompt or max_tokens."
    )


def _fits(prompt_tokens: int, max_tokens: int, max_model_len: int) -> bool:
    return prompt_tokens < max_model_len and prompt_tokens + max(max_tokens, 0) <= max_model_len


def check_length(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Refuse prompt + requested completion beyond the context window."""
    if not _fits(prompt_tokens, max_tokens, max_model_len):
        total = prompt_tokens + max(max_tokens, 0)
        raise _refuse(max_model_len, str(prompt_tokens), max_tokens, str(total))


def check_chars(chars: int, max_tokens: int, max_model_len: int, max_token_chars: int | None):
    """Refuse, unencoded, a text of `chars` characters that cannot fit in any encoding.

    No token covers more than `max_token_chars` characters, so the text needs at
    least ceil(chars / max_token_chars) tokens; None means no such bound is known.
    """
    if max_token_chars is None:
        return
    least = -(-chars // max_token_chars)
    if not _fits(least, max_tokens, max_model_len):
        total = least + max(max_tokens, 0)
        raise _refuse(max_model_len, f"at least {least}", max_tokens, f"at least {total}")
