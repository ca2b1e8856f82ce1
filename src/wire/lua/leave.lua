redis.call('LREM', KEYS[2], 1, ARGV[1])
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[2]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    -- The head's tag: up to its first '.', or 8 characters (a ticket of a
    -- client before issue 31).
    local dot = string.find(head, '.', 1, true)
    local tag = dot and string.sub(head, 1, dot - 1) or string.sub(head, 1, 8)
    redis.call('PUBLISH', ARGV[3] .. '/' .. tag, 'p:0:' .. head)
  end
  return 1
end
return 0
