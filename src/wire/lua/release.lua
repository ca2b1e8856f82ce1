if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local waiting = redis.call('PUBSUB', 'NUMSUB', ARGV[3])[2]
  if waiting > 0 then
    redis.call('PUBLISH', ARGV[3], ARGV[2] .. ':' .. waiting)
  end
  return 1
end
return 0
