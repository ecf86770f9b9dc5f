"""Speculative decoding: proposers register themselves on import."""

from maas_services.engine.spec import draft_model, ngram  # noqa: F401
