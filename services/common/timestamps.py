"""Times given by people: Unix seconds or ISO 8601 (UTC when no zone is given)."""

from datetime import UTC, datetime


def parse_timestamp(value: str) -> int:
    """Unix seconds; raises ValueError for anything else."""
    if value.isdigit():
        return int(value)
    parsed = datetime.fromisoformat(value)
    return int((parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp())
