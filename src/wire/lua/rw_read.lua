-- KEYS: writer, readers, waiting writer, this reader's entry[, fence].
-- ARGV: value, ttl ms, clock seed, "1" to prune the index or "".
-- One MGET: the writer key, the waiting writer's marker, the fence.
local got = redis.call('MGET', KEYS[1], KEYS[3], KEYS[5] or KEYS[1])
if got[1] or got[2] then
  -- A writer holds, or a writer waits: refused, with how long it lasts.
  local left = redis.call('PTTL', KEYS[1])
  if left == -2 then
    left = redis.call('PTTL', KEYS[3])
  end
  return {0, left}
end
-- The index keeps the names of entries whose keys are gone (released or
-- expired) until pruned: here when the client asks (one read in 8, drawn
-- by the client), so that a lock only ever read stays small without a
-- walk, or even a count, on every read.
if ARGV[4] == '1' then
  local names = redis.call('SMEMBERS', KEYS[2])
  if #names > 0 then
    if #names <= 1000 and redis.call('EXISTS', unpack(names)) == 0 then
      redis.call('DEL', KEYS[2])
    else
      for _, e in ipairs(names) do
        if redis.call('EXISTS', e) == 0 then
          redis.call('SREM', KEYS[2], e)
        end
      end
    end
  end
end
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], KEYS[4])
if not KEYS[5] then
  return 0
end
-- The generation seen: the fence as it is, seeded from the clock when
-- absent or below 2^40 (as the acquire's INCR would).
local f = got[3]
if not f or (tonumber(f) or 1099511627776) < 1099511627776 then
  f = redis.call('INCRBY', KEYS[5], ARGV[3])
end
f = tonumber(f)
if not f or f >= 9007199254740992 then
  redis.call('DEL', KEYS[4])
  return redis.error_reply('ERR fence at 2^53 or not a number: tokens past it are not exact')
end
return f
