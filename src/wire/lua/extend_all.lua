-- KEYS: the set's lock keys. ARGV: value, ttl ms.
-- All or nothing: every key is looked at before any is extended. 1 all
-- extended; -1 a key holds another value, 0 a key is gone (nothing
-- extended either way).
local gone = false
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v ~= ARGV[1] then
    if v then
      return -1
    end
    gone = true
  end
end
if gone then
  return 0
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
