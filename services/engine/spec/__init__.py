"""Speculative decoding: proposers register themselves on import."""

from services.engine.spec import ngram  # noqa: F401
