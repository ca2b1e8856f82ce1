local v = redis.call('HMGET', KEYS[1], 'value', 'fence', 'until', 'delta', 'error', 'error_until')
if not v[2] then
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = false
if v[3] then
  left = tonumber(v[3]) - now
end
local error_left = false
if v[6] then
  error_left = tonumber(v[6]) - now
end
return {v[1] or false, v[2], left, v[4] or false, v[5] or false, error_left}
