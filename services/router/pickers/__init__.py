"""Pickers: choose one endpoint from the scored candidates."""
