"""A migrated request's delivered tokens, replayed into a fresh sample.

When an engine fails mid-stream, the gateway sends the request to another
replica with the output its client already has (GenerateRequest.
resume_token_ids, docs/gateway.md "Migration"). The new sample holds them as
generated output (so max_tokens, min_tokens, penalties and the seeded
per-position random streams of sampler.py count them), and this module walks
its text and grammar state over them: the detokenizer and the stop-string
matcher end holding exactly what the failed replica held (an incomplete
character, the start of a stop string), so the first text streamed after
the resume is what the failed replica would have streamed next; the grammar
matcher ends where the delivered tokens left it. Their text is dropped: the
client has it.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maas_services.engine.grammar.matcher import GrammarState
    from maas_services.engine.request import SampleText


class ResumeError(ValueError):
    """The tokens cannot be the output of this request so far; the message says why."""


def replay(text: "SampleText", grammar: "GrammarState | None", tokens: list[int]) -> None:
    """Advance one sample's text and grammar state over its delivered tokens."""
    for position, token in enumerate(tokens):
        if grammar is not None and not grammar.accept(token):
            raise ResumeError(f"resume token {position} ({token}) breaks the request's grammar")
        _, stopped = text.stops.push(text.detokenizer.push(token))
        if stopped:
            raise ResumeError(f"resume token {position} ({token}) completes a stop string")
    if grammar is not None and grammar.terminated:
        raise ResumeError("the resume tokens already complete the request's grammar")
