"""Billing's relational store: line items, hourly and daily rollups, the outbox.

Redis keeps what must be fast and shared (the usage stream, running totals,
month counters, balances); everything that grows with traffic lives here.
schema.py says what the tables are, partitions.py how line items are split
by day, line_items.py how a batch of events is written exactly once.
"""
