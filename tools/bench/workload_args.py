"""Flags several scenarios share, declared once: argparse refuses a flag twice.

Their defaults are None, so a flag not given leaves each scenario's own
default (uniform-random's 16 clients, concurrency's 8). Scenarios name their
dataclass fields after their flags, so one from_args builds any of them.
"""

import argparse
from dataclasses import asdict, fields


def add_shared_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "traffic shape (scenarios that use it; defaults per scenario)"
    )
    group.add_argument("--requests", type=int, help="requests measured (open-loop: chat requests)")
    group.add_argument(
        "--concurrency", type=int, help="clients in a closed loop (uniform-random, concurrency)"
    )
    group.add_argument(
        "--request-rate",
        type=float,
        help="Poisson arrivals per second, sent whether or not earlier ones finished "
        "(rate, chat, long-prefill-mix)",
    )
    group.add_argument(
        "--prompt-tokens", type=int, help="prompt length (uniform-random, rate, concurrency)"
    )


def from_args(cls, args: argparse.Namespace):
    """cls built from every flag given whose name is one of its fields."""
    given = {}
    for field in fields(cls):
        value = getattr(args, field.name, None)
        if value is not None:
            given[field.name] = tuple(value) if isinstance(value, list) else value
    return cls(**given)


def add_range_argument(group, flag: str, default: tuple[int, int], what: str) -> None:
    """A LOW HIGH pair of token counts (default None: the scenario's own applies)."""
    low, high = default
    group.add_argument(
        flag, type=int, nargs=2, metavar=("LOW", "HIGH"), help=f"{what} (default: {low} {high})"
    )


class RequestsWorkload:
    """A dataclass workload of `requests` requests whose fields are named after its flags."""

    @classmethod
    def from_args(cls, args: argparse.Namespace):
        return from_args(cls, args)

    def describe(self) -> dict:
        return asdict(self)

    def total_requests(self) -> int:
        return self.requests
