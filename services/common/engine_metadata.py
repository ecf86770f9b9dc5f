"""What an engine tells its caller outside the stream's messages, as gRPC metadata.

SCHEDULED goes out as a Generate call's initial metadata when the request first
enters a model step, ahead of any output or error. A request that failed
before that (refused, still queued, the engine gone while it waited) cannot
have caused the failure, so the gateway may retry it on another replica; one
that reached a step may be what broke it, and is not sent on to break another.
"""

SCHEDULED_KEY = "maas-engine-scheduled"
SCHEDULED = ((SCHEDULED_KEY, "1"),)


def was_scheduled(initial_metadata) -> bool:
    """Whether a call's initial metadata (None: none arrived) says it reached a step."""
    return any(key == SCHEDULED_KEY for key, _ in initial_metadata or ())
