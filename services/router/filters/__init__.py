"""Filters: drop candidates that must not (available) or should not (overload) be picked."""
