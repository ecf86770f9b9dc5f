"""The context-length rule, shared by the tokenizer service and the engine."""


class ContextLengthError(ValueError):
    pass


def check_length(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Refuse prompt + requested completion beyond the context window.

    The message names both numbers so a client can trim the right part.
    """
    total = prompt_tokens + max(max_tokens, 0)
    if prompt_tokens >= max_model_len or total > max_model_len:
        raise ContextLengthError(
            f"maximum context length is {max_model_len} tokens, but {total} tokens were "
            f"requested ({prompt_tokens} in the prompt, {max(max_tokens, 0)} for the "
            "completion); shorten the prompt or lower max_tokens"
        )
