-- A ticket's client tag: up to its first '.', or 8 characters (a ticket
-- of a client before issue 31).
local function tag_of(t)
  local dot = string.find(t, '.', 1, true)
  return dot and string.sub(t, 1, dot - 1) or string.sub(t, 1, 8)
end
local q = KEYS[2]
local pttl = redis.call('PTTL', KEYS[1])
local free = pttl == -2
if ARGV[3] ~= '' and free and redis.call('LINDEX', q, 0) == ARGV[3] then
  local client = tag_of(ARGV[3])
  for _, t in ipairs(redis.call('LRANGE', q, 0, -1)) do
    if tag_of(t) == client then
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
-- The waiting marker lives as long as this waiter may wait.
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
end
local head = redis.call('LINDEX', q, 0)
if free and head and tag_of(head) ~= tag_of(ARGV[1]) then
  redis.call('PUBLISH', ARGV[4] .. '/' .. tag_of(head), 'p:0:' .. head)
end
return {head, pttl, pos + 1}
