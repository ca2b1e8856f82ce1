local q = KEYS[2]
local pttl = redis.call('PTTL', KEYS[1])
local free = pttl == -2
if ARGV[3] ~= '' and free and redis.call('LINDEX', q, 0) == ARGV[3] then
  local client = string.sub(ARGV[3], 1, 8)
  for _, t in ipairs(redis.call('LRANGE', q, 0, -1)) do
    if string.sub(t, 1, 8) == client then
      redis.call('LREM', q, 1, t)
    end
  end
end
local pos = redis.call('LPOS', q, ARGV[1])
local created = false
if not pos then
  pos = redis.call('RPUSH', q, ARGV[1]) - 1
  created = pos == 0
end
if ARGV[5] == '1' or created then
  redis.call('PEXPIRE', q, ARGV[2])
end
local head = redis.call('LINDEX', q, 0)
if free and head and string.sub(head, 1, 8) ~= string.sub(ARGV[1], 1, 8) then
  redis.call('PUBLISH', ARGV[4] .. '/' .. string.sub(head, 1, 8), 'p:0:' .. head)
end
return {head, pttl, pos + 1}
