-- KEYS: writer, readers, waiting writer[, fence].
-- ARGV: the most reader entries to return.
-- Read-only (GET, PTTL, SMEMBERS): the writer key's value and PTTL, the
-- waiting writer's marker and its PTTL, the fence, the number of names in
-- the readers' index, and up to ARGV[1] live reader entries (value, PTTL
-- each). Names whose keys are gone are skipped, not pruned.
local w = redis.call('GET', KEYS[1])
local wt = redis.call('PTTL', KEYS[1])
local x = redis.call('GET', KEYS[3])
local xt = redis.call('PTTL', KEYS[3])
local f = false
if KEYS[4] then
  f = redis.call('GET', KEYS[4])
end
local names = redis.call('SMEMBERS', KEYS[2])
local most = tonumber(ARGV[1])
local entries = {}
for _, e in ipairs(names) do
  if #entries >= 2 * most then
    break
  end
  local v = redis.call('GET', e)
  if v then
    entries[#entries + 1] = v
    entries[#entries + 1] = redis.call('PTTL', e)
  end
end
return {w, wt, x, xt, f, #names, entries}
