local len = redis.call('RPUSH', KEYS[1], ARGV[1])
if len == 1 or ARGV[3] == '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
-- The waiting marker lives as long as this waiter may wait.
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
end
return {len, redis.call('PTTL', KEYS[2])}
