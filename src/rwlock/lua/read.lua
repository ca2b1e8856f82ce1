-- KEYS: writer, readers, waiting writer, this reader's entry[, fence].
-- ARGV: value, ttl ms, clock seed.
-- A writer holds, or a writer waits: refused, with how long it lasts.
local w = redis.call('PTTL', KEYS[1])
if w ~= -2 then
  return {0, w}
end
local x = redis.call('PTTL', KEYS[3])
if x ~= -2 then
  return {0, x}
end
-- Entries whose keys expired (a reader that died, or released: the
-- release deletes the entry's key, not its name here) leave the index.
for _, e in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('EXISTS', e) == 0 then
    redis.call('SREM', KEYS[2], e)
  end
end
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], KEYS[4])
if not KEYS[5] then
  return 0
end
-- The generation seen: the fence as it is, seeded from the clock when
-- absent (as the acquire's INCR would).
local f = redis.call('GET', KEYS[5])
if not f then
  redis.call('SET', KEYS[5], ARGV[3])
  f = ARGV[3]
end
f = tonumber(f)
if not f or f >= 9007199254740992 then
  redis.call('DEL', KEYS[4])
  return redis.error_reply('ERR fence at 2^53 or not a number: tokens past it are not exact')
end
return f
