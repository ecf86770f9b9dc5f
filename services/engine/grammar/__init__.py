"""Grammar-constrained decoding: outputs that follow a JSON schema, a regex, a choice or EBNF.

Built on xgrammar rather than llguidance: it is the backend vLLM and SGLang
use by default, so clients moving from them get the same grammar dialect
(JSON schema, regex, EBNF, structural tags) and the same refusals; its
GrammarMatcher fills one row of a [batch, ceil(vocab / 32)] int32 bitmask per
constrained sequence, which one batched call applies to the logits (CPU,
CUDA and Triton kernels); its compiler caches compiled grammars (LRU bounded
by bytes) and precomputes the context-independent part of every token mask,
so a step costs a table lookup per row; and matchers roll back, which
speculative decoding needs to check drafted tokens. llguidance computes masks
lazily per step (no compile step, good for huge grammars) but we want the
compile cost paid, and refused when too high, before a request is admitted.

One concern per file: spec (what a request asks for, with caps), vocab (the
engine's tokenizer as xgrammar sees it), compiler (the cache), matcher (one
sequence's state) and bitmask (the batch's mask applied to the logits).
"""
