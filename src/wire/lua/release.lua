if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if KEYS[2] and ARGV[4] ~= '' then
    redis.call('LREM', KEYS[2], 1, ARGV[4])
  end
  local subs
  if KEYS[2] then
    subs = redis.call('PUBSUB', 'NUMSUB', ARGV[3], ARGV[3] .. '/q')
  else
    subs = redis.call('PUBSUB', 'NUMSUB', ARGV[3])
  end
  local notice = ARGV[2] .. ':' .. subs[2]
  if subs[2] > 0 then
    redis.call('PUBLISH', ARGV[3], notice)
  end
  if KEYS[2] and subs[4] > 0 then
    local next = redis.call('LPOP', KEYS[2])
    if next then
      redis.call('PUBLISH', ARGV[3] .. '/' .. string.sub(next, 1, 8), ARGV[2] .. ':' .. subs[4] .. ':' .. next)
      return 2
    end
  end
  return 1
end
return 0
