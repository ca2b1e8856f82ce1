local mine = redis.call('GET', KEYS[1]) == ARGV[1]
if mine then
  redis.call('DEL', KEYS[1])
end
if not KEYS[2] then
  if not mine then
    return 0
  end
  local waiting = redis.call('PUBSUB', 'NUMSUB', ARGV[3])[2]
  if waiting > 0 then
    redis.call('PUBLISH', ARGV[3], ARGV[2] .. ':' .. waiting)
  end
  return 1
end
if ARGV[4] ~= '' then
  redis.call('LREM', KEYS[2], 1, ARGV[4])
end
local subs = redis.call('PUBSUB', 'NUMSUB', ARGV[3], ARGV[3] .. '/q')
if mine and subs[2] > 0 then
  redis.call('PUBLISH', ARGV[3], ARGV[2] .. ':' .. subs[2])
end
local named = false
if subs[4] > 0 then
  local next = redis.call('LINDEX', KEYS[2], 0)
  if next then
    local channel = ARGV[3] .. '/' .. string.sub(next, 1, 8)
    local notice = ARGV[2] .. ':' .. subs[4] .. ':' .. next
    local ttl = KEYS[3] and string.match(next, '%-(%d+)$')
    if ttl and redis.call('PUBSUB', 'NUMSUB', channel)[2] > 0
        and redis.call('SET', KEYS[1], string.sub(next, 1, 8) .. ':' .. string.sub(next, 9) .. ':' .. ARGV[2], 'NX', 'PX', ttl) then
      local f = redis.call('INCR', KEYS[3])
      if f == 1 then
        f = redis.call('INCRBY', KEYS[3], ARGV[5])
      end
      if f < 9007199254740992 then
        notice = notice .. ':' .. string.format('%.0f', f)
      else
        redis.call('DEL', KEYS[1])
      end
    end
    redis.call('PUBLISH', channel, notice)
    named = true
  end
end
if mine and named then
  return 2
elseif mine then
  return 1
elseif named then
  return 3
end
return 0
