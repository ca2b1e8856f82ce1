for i = 1, #KEYS do
  local f = redis.call('GET', KEYS[i])
  local v = ARGV[i]
  if not f or #f < #v or (#f == #v and f < v) then
    redis.call('SET', KEYS[i], v)
  end
end
return #KEYS
