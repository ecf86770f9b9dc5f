"""The grammar contract: what a request may ask for, what it may cost, and its compile.

A structured-output request (JSON schema, regex, choice, EBNF) is read by three
services: the gateway checks its size caps, the tokenizer compiles it once to
refuse a bad or too-costly grammar before admission, and the engine compiles
it again (same caps, same worker, same vocabulary) to decode under it. So the
definitions they must agree on live here, not inside one of them: spec (what a
request asks for, with caps), proto (the wire form), cost (caps read from the
parsed grammar), worker (the compile in a child process, killed at its
deadline), cache (compiled grammars per tenant, bounded by bytes), compiler
(the worker behind the cache) and vocab (a tokenizer as xgrammar sees it). The
engine's own use of a compiled grammar on the logits (matcher, bitmask, draft)
stays in services/engine/grammar/.

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
"""
