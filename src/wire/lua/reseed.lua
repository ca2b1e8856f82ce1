local n = #KEYS
for i = 1, n do
  local f = redis.call('GET', KEYS[i])
  local v = ARGV[i]
  if not f or #f < #v or (#f == #v and f < v) then
    redis.call('SET', KEYS[i], v, 'PX', ARGV[n + 1])
  end
end
return n
