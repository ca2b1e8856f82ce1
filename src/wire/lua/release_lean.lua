-- KEYS: lock, waiting marker. ARGV: value.
-- The home node's release when the client knows of no ticket, handover or
-- claim: compare-and-delete, unless the resource is waited for (the
-- marker), in which case nothing is done here and -1 asks the client for
-- the full release (`release.lua`), which names and notifies.
local got = redis.call('MGET', KEYS[1], KEYS[2])
if got[2] then
  return -1
end
if got[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
