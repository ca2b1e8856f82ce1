if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local f = redis.call('GET', KEYS[2])
if not f or #f < #ARGV[2] or (#f == #ARGV[2] and f < ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
