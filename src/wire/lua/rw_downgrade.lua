-- KEYS: writer, readers, the new reader entry. ARGV: value, ttl ms.
-- The writer's key becomes a reader's entry in one step: no instant in
-- which this node holds neither for us.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], KEYS[3])
return 1
