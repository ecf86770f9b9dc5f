"""Grammar-constrained decoding in the engine: a compiled grammar applied to the logits.

What a request asks for, its caps and its compile are shared with the gateway
and the tokenizer, so they live in services/common/grammar/ (with why
xgrammar). Here is only what the engine does with a compiled grammar, one
concern per file: matcher (one sequence's state), bitmask (the batch's mask
applied to the logits) and draft (a speculative draft cut at the first token
the grammar forbids).
"""
