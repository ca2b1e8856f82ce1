-- KEYS: writer, readers, waiting writer[, fence].
-- ARGV: value, ttl ms, clock seed, waiter's marker id or '', marker life ms.
-- Refused (a writer holds, or a reader): a waiting writer marks the lock
-- so that no new reader is admitted here while it waits.
local function refuse(pttl)
  if ARGV[4] ~= '' then
    local x = redis.call('GET', KEYS[3])
    if not x or x == ARGV[4] then
      redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
    end
  end
  return {0, pttl}
end
local w = redis.call('PTTL', KEYS[1])
if w ~= -2 then
  return refuse(w)
end
-- Any live reader entry refuses; names whose keys are gone are pruned
-- (all at once when none lives: one EXISTS over them, one DEL).
local names = redis.call('SMEMBERS', KEYS[2])
if #names > 0 then
  if #names <= 1000 and redis.call('EXISTS', unpack(names)) == 0 then
    redis.call('DEL', KEYS[2])
  else
    local longest = -2
    for _, e in ipairs(names) do
      local t = redis.call('PTTL', e)
      if t == -2 then
        redis.call('SREM', KEYS[2], e)
      elseif t == -1 or longest == -1 then
        longest = -1
      elseif t > longest then
        longest = t
      end
    end
    if longest ~= -2 then
      return refuse(longest)
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) == ARGV[4] then
  redis.call('DEL', KEYS[3])
end
if not KEYS[4] then
  return 0
end
local f = redis.call('INCR', KEYS[4])
-- Below 2^40: absent or unseeded (see acquire.lua).
if f < 1099511627776 then
  f = redis.call('INCRBY', KEYS[4], ARGV[3])
end
if f >= 9007199254740992 then
  redis.call('DEL', KEYS[1])
  return redis.error_reply('ERR fence at 2^53: tokens past it are not exact')
end
return f
