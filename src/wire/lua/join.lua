local len = redis.call('RPUSH', KEYS[1], ARGV[1])
if len == 1 or ARGV[3] == '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {len, redis.call('PTTL', KEYS[2])}
