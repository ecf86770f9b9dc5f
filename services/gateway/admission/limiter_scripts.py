"""The rate limiter's Lua: each script is one atomic step in Redis.

Atomic scripts are what make the limits exact across gateway replicas: no
replica can read a count between another's check and its write. Time comes
from Redis (TIME), not from the replicas, so their clock skew does not matter.

Per tenant (the {tenant} hash tag keeps a tenant's keys on one cluster slot):
  KEYS[1] maas:rl:{t}:log       zset  request id -> admission time (ms)
  KEYS[2] maas:rl:{t}:tokens    hash  request id -> tokens charged
  KEYS[3] maas:rl:{t}:sum       int   sum of the hash (tokens in the window)
  KEYS[4] maas:rl:{t}:inflight  zset  lease member -> lease expiry (ms)
  KEYS[5] maas:rl:{t}:full      never written, see _REFUSE_WHEN_FULL

The log is a sliding window: exactly the requests admitted in the last
window_ms count, with no burst at a window boundary as fixed windows allow.

A request is admitted in two steps. ADMIT, before any work is done for it
(tokenizing included), counts it against RPM and takes its concurrency lease,
charged 0 tokens; RESERVE, once the prompt's size is known, charges prompt +
max_tokens against TPM. So a request that fails in between (a prompt over the
context length) has still cost its tenant a request. A request with n
sequences holds n lease members (id, id#2, ... id#n): it costs n of the
tenant's concurrency, as it does of an engine's batch.

ADMIT given the request's need (ARGV[9] > 0) does both steps in one call,
for a request already tokenized: the checks run in the two steps' order, so
the refusal names the limit the two calls would have named, and a request
refused for its need (not its floor) is counted, as RESERVE's refusal is.
"""

# Shared prelude: the clock, dropping what has left the window or whose lease
# ran out (a replica that died mid-request cannot hold a slot forever), and
# what every decision returns.
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
local function lease_member(id, k)
  if k == 1 then return id end
  return id .. '#' .. k
end
-- Until the window gives back `enough` tokens: the admission time of the
-- entry whose expiry frees the last of them, plus the window.
local function tokens_freed_in(enough, window)
  local freed = 0
  local entries = redis.call('ZRANGE', log, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    freed = freed + tonumber(redis.call('HGET', tokens, entries[i]) or '0')
    if freed >= enough then return tonumber(entries[i + 1]) + window - now end
  end
  return window
end
-- The TPM's refusal of `need` more tokens beside `used`: reason, retry (ms).
local function tpm_refusal(need, used, tpm, window)
  if need > tpm then return 'too_large', window end
  if used + need > tpm then return 'tokens', tokens_freed_in(used + need - tpm, window) end
  return '', 0
end
-- {admitted, reason, retry_after_ms, requests_left, tokens_left, reset_ms,
-- tokens asked (what a tokens or too_large refusal is about)}.
-- OpenAI's reset headers: until the limit is back to its initial state,
-- i.e. until the newest entry leaves the window.
local function decision(reason, retry, rpm, tpm, window, asked)
  local count = redis.call('ZCARD', log)
  local used = tonumber(redis.call('GET', sum_key) or '0')
  local reset = 0
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #newest > 0 then reset = tonumber(newest[2]) + window - now end
  return {reason == '' and 1 or 0, reason, math.max(retry, 0), math.max(rpm - count, 0),
          math.max(tpm - used, 0), math.max(reset, 0), asked}
end
"""

# Redis checks maxmemory only before a script's first write command, and the
# prelude's first write (ZREMRANGEBYSCORE) is not one it checks: a full Redis
# would let every later write through. LPUSHX to a key that never exists
# stores nothing but is checked, so a script that would grow the data refuses
# (OOM) before it has changed anything. SETTLE only frees, and must run full.
_REFUSE_WHEN_FULL = """
redis.call('LPUSHX', KEYS[5], 0)
"""

# ARGV: request id, rpm, tpm, max concurrency, tokens needed at least, window
# ms, lease ms, sequences, tokens needed (0: not known yet). Counts the
# request, takes its lease and charges its need, or refuses.
ADMIT = (
    _REFUSE_WHEN_FULL
    + _PRELUDE
    + """
local id = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local floor, window, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local seqs, need = tonumber(ARGV[8]), tonumber(ARGV[9])
expire(window)
local count = redis.call('ZCARD', log)
local used = tonumber(redis.call('GET', sum_key) or '0')
local running = redis.call('ZCARD', inflight)

local reason, retry, asked, for_need = '', 0, floor, false
if rpm > 0 and count + 1 > rpm then
  reason = 'requests'
  local oldest = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')
  retry = tonumber(oldest[2]) + window - now
elseif tpm > 0 then
  reason, retry = tpm_refusal(floor, used, tpm, window)
end
if reason == '' and conc > 0 and running + seqs > conc then
  reason = 'concurrency'
  retry = 1000
elseif reason == '' and tpm > 0 and need > 0 then
  asked, for_need = need, true
  reason, retry = tpm_refusal(need, used, tpm, window)
end

-- Refused for its need, not its floor, the request was one all the same:
-- counted, with no lease.
if reason == '' or for_need then
  local charge = (reason == '' and tpm > 0) and need or 0
  -- A tenant limited only in concurrency needs no log: it would grow with
  -- the request rate for nothing.
  if rpm > 0 or tpm > 0 then
    redis.call('ZADD', log, now, id)
    redis.call('HSET', tokens, id, charge)
  end
  if charge > 0 then redis.call('INCRBY', sum_key, charge) end
  if reason == '' then
    for k = 1, seqs do redis.call('ZADD', inflight, now + lease, lease_member(id, k)) end
  end
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], window + lease) end
end
return decision(reason, retry, rpm, tpm, window, asked)
"""
)

# ARGV: request id, rpm, tpm, tokens needed, window ms.
# Charges an admitted request's tokens, or refuses them; either way the
# request keeps its place in the request log (it was counted at ADMIT).
RESERVE = (
    _REFUSE_WHEN_FULL
    + _PRELUDE
    + """
local id = ARGV[1]
local rpm, tpm, need, window = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5])
expire(window)
local charged = tonumber(redis.call('HGET', tokens, id) or '0')
local used = tonumber(redis.call('GET', sum_key) or '0') - charged
local reason, retry = tpm_refusal(need, used, tpm, window)
if reason == '' then
  -- Tokenizing took longer than the window: the request counts again from now.
  if not redis.call('ZSCORE', log, id) then redis.call('ZADD', log, now, id) end
  redis.call('HSET', tokens, id, need)
  redis.call('INCRBY', sum_key, need - charged)
end
return decision(reason, retry, rpm, tpm, window, need)
"""
)

# ARGV: request id, tokens actually used, window ms, sequences.
# Sets the request's charge to what it used (a refund, or more if it ran past
# its reservation) and ends its lease. Returns the change in tokens.
SETTLE = (
    _PRELUDE
    + """
local id, actual = ARGV[1], tonumber(ARGV[2])
expire(tonumber(ARGV[3]))
for k = 1, tonumber(ARGV[4]) do redis.call('ZREM', inflight, lease_member(id, k)) end
local charged = redis.call('HGET', tokens, id)
if not charged then return 0 end
local delta = actual - tonumber(charged)
redis.call('HSET', tokens, id, actual)
redis.call('INCRBY', sum_key, delta)
return delta
"""
)
