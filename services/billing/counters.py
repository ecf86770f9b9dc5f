"""Per-tenant token counters in Redis, applied exactly once per request.

One Lua script does the dedup mark, the counter increments and the XACK, so a
crash at any point either applied the whole event or none of it, and a
redelivered entry (after a crash before XACK) is acked without counting twice.
"""

from redis.asyncio import Redis

from services.common.usage_event import UsageEvent

TENANT_PREFIX = "maas:billing:tenant:"
SEEN_PREFIX = "maas:billing:seen:"
SEEN_TTL_SECONDS = 7 * 24 * 3600
TENANT_FIELDS = ("requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens")

# KEYS: seen mark, tenant hash, usage stream. ARGV: ttl, group, entry id,
# model, prompt, cached, completion. Returns 1 when applied, 0 for a duplicate.
_APPLY = """
local fresh = redis.call('SET', KEYS[1], ARGV[3], 'NX', 'EX', ARGV[1])
if fresh then
  local model = ARGV[4]
  redis.call('HINCRBY', KEYS[2], 'requests', 1)
  redis.call('HINCRBY', KEYS[2], 'prompt_tokens', ARGV[5])
  redis.call('HINCRBY', KEYS[2], 'cached_prompt_tokens', ARGV[6])
  redis.call('HINCRBY', KEYS[2], 'completion_tokens', ARGV[7])
  redis.call('HINCRBY', KEYS[2], 'model:' .. model .. ':requests', 1)
  redis.call('HINCRBY', KEYS[2], 'model:' .. model .. ':prompt_tokens', ARGV[5])
  redis.call('HINCRBY', KEYS[2], 'model:' .. model .. ':cached_prompt_tokens', ARGV[6])
  redis.call('HINCRBY', KEYS[2], 'model:' .. model .. ':completion_tokens', ARGV[7])
end
redis.call('XACK', KEYS[3], ARGV[2], ARGV[3])
if fresh then return 1 end
return 0
"""


class TenantCounters:
    def __init__(self, redis: Redis, stream: str, group: str):
        self._redis = redis
        self._stream = stream
        self._group = group
        self._apply = redis.register_script(_APPLY)

    async def apply(self, entry_id: str, event: UsageEvent) -> bool:
        applied = await self._apply(
            keys=[SEEN_PREFIX + event.request_id, TENANT_PREFIX + event.tenant, self._stream],
            args=[
                SEEN_TTL_SECONDS,
                self._group,
                entry_id,
                event.model,
                event.prompt_tokens,
                event.cached_prompt_tokens,
                event.completion_tokens,
            ],
        )
        return bool(applied)

    async def read(self, tenant: str) -> dict[str, int]:
        raw = await self._redis.hgetall(TENANT_PREFIX + tenant)
        return {key: int(value) for key, value in raw.items()}
