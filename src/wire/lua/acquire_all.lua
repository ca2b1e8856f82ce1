-- KEYS: n lock keys, then (fenced) the n fence keys in the same order.
-- ARGV: value, ttl ms, seed, n, "1" to probe or "".
-- All or nothing: every lock key is looked at before anything is written.
local n = tonumber(ARGV[4])
for i = 1, n do
  local left = redis.call('PTTL', KEYS[i])
  if left ~= -2 then
    if ARGV[5] == '1' then
      return {i, left}
    end
    return {i}
  end
end
local fenced = #KEYS > n
if fenced then
  -- A fence that would pass 2^53 refuses before any key is set. A key
  -- named twice (two resources of one bucket) moves twice: count them.
  for i = n + 1, #KEYS do
    local f = tonumber(redis.call('GET', KEYS[i]) or '0')
    if f + n >= 9007199254740992 then
      return redis.error_reply('ERR fence at 2^53: tokens past it are not exact')
    end
  end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
local reply = {0}
if fenced then
  for i = n + 1, #KEYS do
    local f = redis.call('INCR', KEYS[i])
    -- Below 2^40: absent or unseeded (see acquire.lua).
    if f < 1099511627776 then
      f = redis.call('INCRBY', KEYS[i], ARGV[3])
    end
    reply[#reply + 1] = f
  end
end
return reply
