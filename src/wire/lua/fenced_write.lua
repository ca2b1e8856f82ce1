local cur = redis.call('HGET', KEYS[1], 'fence')
if cur and (#cur > #ARGV[2] or (#cur == #ARGV[2] and cur > ARGV[2])) then
  return {0, cur}
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2])
return 1
