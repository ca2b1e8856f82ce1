local q = KEYS[2]
if ARGV[3] ~= '' and redis.call('LINDEX', q, 0) == ARGV[3] and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('LPOP', q)
end
if not redis.call('LPOS', q, ARGV[1]) then
  if ARGV[4] == '1' then
    redis.call('LPUSH', q, ARGV[1])
  else
    redis.call('RPUSH', q, ARGV[1])
  end
end
redis.call('PEXPIRE', q, ARGV[2])
return {redis.call('LINDEX', q, 0), redis.call('PTTL', KEYS[1])}
