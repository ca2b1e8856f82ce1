-- KEYS: fence. ARGV: seed.
-- A fence an acquire's transaction found absent, on a node whose answer
-- came after its round decided (no vote wanted): moved and seeded as the
-- acquire would, so the nodes stay level. No lock key is touched.
local f = redis.call('INCR', KEYS[1])
-- Below 2^40: absent or unseeded (see acquire.lua).
if f < 1099511627776 then
  f = redis.call('INCRBY', KEYS[1], ARGV[1])
end
return f
