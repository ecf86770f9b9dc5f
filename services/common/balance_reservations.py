"""Reservations against a prepaid balance: where they live in Redis and the Lua that moves them.

A prepaid tenant's balance is only charged when billing applies a request's
usage event, seconds after admission; checking `balance > 0` alone let twenty
concurrent requests spend a balance worth one. So the gateway reserves each
prepaid request's most it can cost (its prompt and n x max_tokens at its
deployment's price) before admitting it, atomically against the balance less
what is already reserved (RESERVE), shrinks the reservation to the real cost
when the request ends (SETTLE, in the round trip of the usage event), and
billing's ledger drops it in the same commit that charges the balance
(RELEASE_FUNCTION, run by services/billing/ledger.py). A request that ends
with nothing to bill is released by the gateway (RELEASE).

Per tenant (the {tenant} hash tag keeps them on one cluster slot), three keys,
none per request, each expiring with its newest reservation:
  deadlines  zset  request id -> when the reservation lapses (ms, Redis TIME)
  costs      hash  request id -> nano-USD held
  sum        int   the sum of `costs`
A reservation lapses at its deadline (set from the longest a request can live
plus billing's lag): a gateway that died mid-request cannot hold the balance
for ever, and every RESERVE drops the lapsed ones first.

Numbers travel as strings: Lua formats numbers with 14 significant digits, and
a balance can be larger than that in nano-USD.
"""

from maas_services.common.billing_keys import PREFIX


def reservation_keys(tenant: str) -> list[str]:
    """[deadlines, costs, sum] of the tenant's reservations."""
    return [f"{PREFIX}reserved:{{{tenant}}}:{part}" for part in ("deadlines", "costs", "sum")]


def full_guard_key(tenant: str) -> str:
    """Never written: RESERVE's LPUSHX to it makes a full Redis refuse the script
    before it changes anything (services/gateway/admission/limiter_scripts.py explains why)."""
    return f"{PREFIX}reserved:{{{tenant}}}:full"


# release_reservation(deadlines, costs, sum, id): drops one reservation, if held.
RELEASE_FUNCTION = """
local function release_reservation(deadlines, costs, sum, id)
  local held = redis.call('HGET', costs, id)
  if held then
    redis.call('DECRBY', sum, held)
    redis.call('HDEL', costs, id)
    redis.call('ZREM', deadlines, id)
  end
end
"""

# KEYS: deadlines, costs, sum, full guard.
# ARGV: request id, cost (nano-USD), hold (ms), the balance's key. The balance
# is named as an argument, not a key: Redis 7 asks write access to every key
# EVALSHA names, and the gateway may only read balances (services/common/redis_acl.py).
# Returns {admitted, nano-USD available after it}; {1, -1} when the tenant has
# no balance (pay as you go), so nothing was reserved.
RESERVE = """
redis.call('LPUSHX', KEYS[4], 0)
local deadlines, costs, sum = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
for _, id in ipairs(lapsed) do
  redis.call('DECRBY', sum, redis.call('HGET', costs, id) or '0')
  redis.call('HDEL', costs, id)
end
if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', deadlines, '-inf', now) end
local balance = redis.call('GET', ARGV[4])
if not balance then return {1, -1} end
local id, cost, hold = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
-- The same request asking again (an admission retried) replaces its own.
local mine = redis.call('HGET', costs, id) or '0'
local available = tonumber(balance) - tonumber(redis.call('GET', sum) or '0') + tonumber(mine)
-- A free request still needs a balance that is not used up.
if available <= 0 or cost > available then return {0, available} end
redis.call('ZADD', deadlines, now + hold, id)
redis.call('HSET', costs, id, ARGV[2])
redis.call('DECRBY', sum, mine)
redis.call('INCRBY', sum, ARGV[2])
local newest = redis.call('ZRANGE', deadlines, -1, -1, 'WITHSCORES')
local ttl = math.max(tonumber(newest[2]) - now, 1)
redis.call('PEXPIRE', deadlines, ttl)
redis.call('PEXPIRE', costs, ttl)
redis.call('PEXPIRE', sum, ttl)
return {1, available - cost}
"""

# KEYS: deadlines, costs, sum. ARGV: request id, its real cost (nano-USD).
# Holds the real cost instead of the most, until billing charges it; a
# reservation already released (billed, lapsed) stays gone, so a settle that
# arrives after billing's commit changes nothing.
SETTLE = """
local deadlines, costs, sum = KEYS[1], KEYS[2], KEYS[3]
local held = redis.call('HGET', costs, ARGV[1])
if not held then return 0 end
redis.call('HSET', costs, ARGV[1], ARGV[2])
redis.call('DECRBY', sum, held)
redis.call('INCRBY', sum, ARGV[2])
return 1
"""

# KEYS: deadlines, costs, sum. ARGV: request id.
RELEASE = (
    RELEASE_FUNCTION
    + """
release_reservation(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
return 1
"""
)
