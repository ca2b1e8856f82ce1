-- KEYS: per resource of the set, its lock key and its waiting marker.
-- ARGV: value, then per resource: notice id, notice channel, "1" when this
-- node is the resource's home (its fair queue) or "".
-- Per resource: 1 deleted, 0 not ours (nothing deleted), -1 left alone for
-- the full release (`release.lua`): its home, waited for, fair waiters
-- listening, who are named there.
local reply = {}
for i = 1, #KEYS / 2 do
  local got = redis.call('MGET', KEYS[2 * i - 1], KEYS[2 * i])
  local channel = ARGV[3 * i]
  local code = 0
  if got[2] and ARGV[3 * i + 1] == '1'
      and redis.call('PUBSUB', 'NUMSUB', channel .. '/q')[2] > 0 then
    code = -1
  elseif got[1] == ARGV[1] then
    redis.call('DEL', KEYS[2 * i - 1])
    code = 1
    -- Nobody marked the resource as waited for: no notice to publish.
    if got[2] then
      local waiting = redis.call('PUBSUB', 'NUMSUB', channel)[2]
      if waiting > 0 then
        redis.call('PUBLISH', channel, ARGV[3 * i - 1] .. ':' .. waiting)
      end
    end
  end
  reply[i] = code
end
return reply
