local cur = redis.call('HGET', KEYS[1], 'fence')
if cur and (#cur > #ARGV[2] or (#cur == #ARGV[2] and cur > ARGV[2])) then
  return {0, cur}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = string.format('%.0f', now + tonumber(ARGV[3]))
if ARGV[5] == 'error' then
  redis.call('HSET', KEYS[1], 'fence', ARGV[2], 'error', ARGV[1], 'error_until', ends)
else
  redis.call('HSET', KEYS[1], 'fence', ARGV[2], 'value', ARGV[1], 'until', ends, 'delta', ARGV[6])
  redis.call('HDEL', KEYS[1], 'error', 'error_until')
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
