local granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not granted and (ARGV[5] == '1' or (ARGV[6] or '') ~= '') then
  local held = redis.call('GET', KEYS[1])
  if (ARGV[5] == '1' and held == ARGV[1])
      or (held and (ARGV[6] or '') ~= '' and redis.sha1hex(held) == ARGV[6]) then
    granted = redis.call('SET', KEYS[1], ARGV[1], 'XX', 'PX', ARGV[2])
  end
end
local f = redis.call('INCR', KEYS[2])
if f == 1 then
  f = redis.call('INCRBY', KEYS[2], ARGV[3])
end
if f >= 9007199254740992 then
  return redis.error_reply('ERR fence at 2^53: tokens past it are not exact')
end
if granted then
  return f
end
if ARGV[4] == '1' then
  return {f, redis.call('PTTL', KEYS[1])}
end
return {f}
