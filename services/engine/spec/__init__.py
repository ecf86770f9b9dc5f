"""Speculative decoding: proposers register themselves on import."""

from services.engine.spec import draft_model, ngram  # noqa: F401
