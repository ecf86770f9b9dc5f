"""The rate limiter's Lua: each script is one atomic step in Redis.

Atomic scripts are what make the limits exact across gateway replicas: no
replica can read a count between another's check and its write. Time comes
from Redis (TIME), not from the replicas, so their clock skew does not matter.

Per tenant (the {tenant} hash tag keeps a tenant's keys on one cluster slot):
  KEYS[1] maas:rl:{t}:log       zset  request id -> admission time (ms)
  KEYS[2] maas:rl:{t}:tokens    hash  request id -> tokens charged
  KEYS[3] maas:rl:{t}:sum       int   sum of the hash (tokens in the window)
  KEYS[4] maas:rl:{t}:inflight  zset  request id -> lease expiry (ms)

The log is a sliding window: exactly the requests admitted in the last
window_ms count, with no burst at a window boundary as fixed windows allow.
"""

# Shared prelude: the clock, and dropping what has left the window or whose
# lease ran out (a replica that died mid-request cannot hold a slot forever).
_PRELUDE = """
local log, tokens, sum_key, inflight = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function expire(window)
  local old = redis.call('ZRANGEBYSCORE', log, '-inf', now - window)
  for _, id in ipairs(old) do
    local charged = tonumber(redis.call('HGET', tokens, id) or '0')
    redis.call('DECRBY', sum_key, charged)
    redis.call('HDEL', tokens, id)
  end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', log, '-inf', now - window) end
  redis.call('ZREMRANGEBYSCORE', inflight, '-inf', now)
end
"""

# ARGV: request id, rpm, tpm, max concurrency, tokens needed, window ms,
# lease ms, commit (1 admits; 0 only checks).
# Returns {admitted, reason, retry_after_ms, requests_left, tokens_left, reset_ms}
ADMIT = (
    _PRELUDE
    + """
local id = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local need, window, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
expire(window)
local count = redis.call('ZCARD', log)
local used = tonumber(redis.call('GET', sum_key) or '0')
local running = redis.call('ZCARD', inflight)

-- Until the window gives back `enough` tokens: the admission time of the
-- entry whose expiry frees the last of them, plus the window.
local function tokens_freed_in(enough)
  local freed = 0
  local entries = redis.call('ZRANGE', log, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    freed = freed + tonumber(redis.call('HGET', tokens, entries[i]) or '0')
    if freed >= enough then return tonumber(entries[i + 1]) + window - now end
  end
  return window
end

local reason, retry = '', 0
if rpm > 0 and count + 1 > rpm then
  reason = 'requests'
  local oldest = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')
  retry = tonumber(oldest[2]) + window - now
elseif tpm > 0 and need > tpm then
  reason = 'too_large'
  retry = window
elseif tpm > 0 and used + need > tpm then
  reason = 'tokens'
  retry = tokens_freed_in(used + need - tpm)
elseif conc > 0 and running + 1 > conc then
  reason = 'concurrency'
  retry = 1000
end

local admitted = reason == '' and 1 or 0
if admitted == 1 and ARGV[8] == '1' then
  -- A tenant limited only in concurrency needs no log: it would grow with
  -- the request rate for nothing.
  if rpm > 0 or tpm > 0 then
    redis.call('ZADD', log, now, id)
    redis.call('HSET', tokens, id, need)
    redis.call('INCRBY', sum_key, need)
    count, used = count + 1, used + need
  end
  redis.call('ZADD', inflight, now + lease, id)
  for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, window + lease) end
end
-- OpenAI's reset headers: until the limit is back to its initial state,
-- i.e. until the newest entry leaves the window.
local reset = 0
local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
if #newest > 0 then reset = tonumber(newest[2]) + window - now end
return {admitted, reason, math.max(retry, 0), math.max(rpm - count, 0),
        math.max(tpm - used, 0), math.max(reset, 0)}
"""
)

# ARGV: request id, tokens actually used, window ms.
# Sets the request's charge to what it used (a refund, or more if it ran past
# its reservation) and ends its lease. Returns the change in tokens.
SETTLE = (
    _PRELUDE
    + """
local id, actual = ARGV[1], tonumber(ARGV[2])
expire(tonumber(ARGV[3]))
redis.call('ZREM', inflight, id)
local charged = redis.call('HGET', tokens, id)
if not charged then return 0 end
local delta = actual - tonumber(charged)
redis.call('HSET', tokens, id, actual)
redis.call('INCRBY', sum_key, delta)
return delta
"""
)
