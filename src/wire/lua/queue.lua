local q = KEYS[2]
local free = redis.call('EXISTS', KEYS[1]) == 0
if ARGV[3] ~= '' and free and redis.call('LINDEX', q, 0) == ARGV[3] then
  local client = string.sub(ARGV[3], 1, 8)
  for _, t in ipairs(redis.call('LRANGE', q, 0, -1)) do
    if string.sub(t, 1, 8) == client then
      redis.call('LREM', q, 1, t)
    end
  end
end
if not redis.call('LPOS', q, ARGV[1]) then
  redis.call('RPUSH', q, ARGV[1])
end
redis.call('PEXPIRE', q, ARGV[2])
local head = redis.call('LINDEX', q, 0)
if free and head and string.sub(head, 1, 8) ~= string.sub(ARGV[1], 1, 8) then
  redis.call('PUBLISH', ARGV[4] .. '/' .. string.sub(head, 1, 8), 'p:0:' .. head)
end
return {head, redis.call('PTTL', KEYS[1])}
