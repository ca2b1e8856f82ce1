local granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local claimant = ARGV[7] or ''
if not granted and (ARGV[5] == '1' or (ARGV[6] or '') ~= '' or claimant ~= '') then
  local held = redis.call('GET', KEYS[1])
  if (ARGV[5] == '1' and held == ARGV[1])
      or (held and (ARGV[6] or '') ~= '' and redis.sha1hex(held) == ARGV[6])
      or (held and claimant ~= '' and string.sub(held, 1, #claimant + 3) == claimant .. ':o:') then
    granted = redis.call('SET', KEYS[1], ARGV[1], 'XX', 'PX', ARGV[2])
  end
end
if claimant ~= '' then
  -- A waiter outside the fair queue, on the home: refused, it claims a
  -- turn (the claims are a list, in order, one per client); granted, its
  -- claim is done.
  local ours = nil
  for _, c in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    if string.sub(c, 1, #claimant + 1) == claimant .. ':' then
      ours = c
    end
  end
  if granted then
    if ours then
      redis.call('LREM', KEYS[3], 0, ours)
    end
  else
    if not ours then
      redis.call('RPUSH', KEYS[3], claimant .. ':' .. ARGV[8])
    end
    -- Alive until the holder's keys expire and the claimant could come.
    local left = math.max(redis.call('PTTL', KEYS[1]), 0) + tonumber(ARGV[8])
    if redis.call('PTTL', KEYS[3]) < left then
      redis.call('PEXPIRE', KEYS[3], left)
    end
    -- So that the next release looks at the claims at all.
    if redis.call('PTTL', KEYS[4]) < left then
      redis.call('SET', KEYS[4], '1', 'PX', left)
    end
  end
end
local f = redis.call('INCR', KEYS[2])
-- Below 2^40: absent, or left unseeded by a fenced acquire's transaction.
if f < 1099511627776 then
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
