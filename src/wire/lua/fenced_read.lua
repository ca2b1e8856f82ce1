local v = redis.call('HMGET', KEYS[1], 'value', 'fence')
if not v[2] then
  return false
end
return {v[1], v[2]}
