if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if KEYS[2] and ARGV[4] ~= '' then
    redis.call('LREM', KEYS[2], 1, ARGV[4])
  end
  local waiting = redis.call('PUBSUB', 'NUMSUB', ARGV[3])[2]
  if waiting > 0 then
    local notice = ARGV[2] .. ':' .. waiting
    if KEYS[2] then
      local next = redis.call('LPOP', KEYS[2])
      if next then
        notice = notice .. ':' .. next
      end
    end
    redis.call('PUBLISH', ARGV[3], notice)
  end
  return 1
end
return 0
