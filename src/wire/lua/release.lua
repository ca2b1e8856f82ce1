-- KEYS: lock, waiting marker[, queue, fence, claim] (the home node).
local got = redis.call('MGET', KEYS[1], KEYS[2])
local held, waited = got[1], got[2]
local mine
if not KEYS[3] and ARGV[4] == 'sha1' then
  -- Keys a handover left for a waiter that will not take them: known by
  -- the SHA1 of the released holder's value, never the value.
  mine = held and redis.sha1hex(held) == ARGV[1]
else
  mine = held == ARGV[1]
end
if mine then
  redis.call('DEL', KEYS[1])
  if waited and string.sub(waited, 1, 2) == 'c:' then
    -- A semaphore's waiter whose turn it is claimed the resource
    -- ('c:{ms}:{claimant}', the marker): the freed key is kept for it for
    -- that long ('r:{claimant}', which its attempt takes as free by its
    -- SHA1), so that a newcomer does not take the slot first.
    local at = string.find(waited, ':', 3, true)
    if at then
      redis.call('SET', KEYS[1], 'r:' .. string.sub(waited, at + 1), 'NX', 'PX', string.sub(waited, 3, at - 1))
    end
  end
end
if not KEYS[3] then
  if not mine then
    return 0
  end
  -- Nobody marked the resource as waited for: no notice to publish.
  if waited then
    local waiting = redis.call('PUBSUB', 'NUMSUB', ARGV[3])[2]
    if waiting > 0 then
      redis.call('PUBLISH', ARGV[3], ARGV[2] .. ':' .. waiting)
    end
  end
  return 1
end
if ARGV[4] ~= '' then
  redis.call('LREM', KEYS[3], 1, ARGV[4])
end
if not waited then
  -- Nobody waits (no fair waiter keeps the marker, no claim was made):
  -- no notice, no naming, no reservation.
  if mine then
    return 1
  end
  return 0
end
local subs = redis.call('PUBSUB', 'NUMSUB', ARGV[3], ARGV[3] .. '/q')
if mine and subs[2] > 0 then
  redis.call('PUBLISH', ARGV[3], ARGV[2] .. ':' .. subs[2])
end
if mine and KEYS[5] and ARGV[4] ~= '' and subs[4] > 0 and redis.call('LLEN', KEYS[3]) > 0 then
  -- The holder came through the queue and clients waiting outside it
  -- claimed turns (refused here while fair waiters queued): the home's
  -- vote is reserved for the first claimant ({tag}:o:{notice}, which its
  -- next attempt takes as free) for as long as its claim said, and nobody
  -- is named. Its own release (no ticket) names the queue's next waiter:
  -- the queue and the outside take turns.
  local claim = redis.call('LPOP', KEYS[5])
  local at = claim and string.find(claim, ':', 1, true)
  if at then
    local life = string.sub(claim, at + 1)
    redis.call('SET', KEYS[1], string.sub(claim, 1, at - 1) .. ':o:' .. ARGV[2], 'NX', 'PX', life)
    -- The queue's head looks again when the reservation would lapse.
    local head = redis.call('LINDEX', KEYS[3], 0)
    local dot = string.find(head, '.', 1, true)
    local tag = dot and string.sub(head, 1, dot - 1) or string.sub(head, 1, 8)
    redis.call('PUBLISH', ARGV[3] .. '/' .. tag, 'r:' .. life .. ':' .. head)
    return 5
  end
end
local named = false
local handed = false
local here = nil
if subs[4] > 0 then
  local next = redis.call('LINDEX', KEYS[3], 0)
  if next then
    -- A ticket's tag ends at its first '.'; a ticket of a client before
    -- issue 31 has none and an 8-character tag.
    local dot = string.find(next, '.', 1, true)
    local tag, rest
    if dot then
      tag, rest = string.sub(next, 1, dot - 1), string.sub(next, dot + 1)
    else
      tag, rest = string.sub(next, 1, 8), string.sub(next, 9)
    end
    local channel = ARGV[3] .. '/' .. tag
    local fence = ''
    local ttl = KEYS[4] and ARGV[8] == '1' and string.match(next, '%-(%d+)$')
    local own = tag == ARGV[6]
    if ttl and (own or redis.call('PUBSUB', 'NUMSUB', channel)[2] > 0)
        and redis.call('SET', KEYS[1], tag .. ':' .. rest .. ':' .. ARGV[2], 'NX', 'PX', ttl) then
      local f = redis.call('INCR', KEYS[4])
      -- Below 2^40: absent or unseeded (see acquire.lua).
      if f < 1099511627776 then
        f = redis.call('INCRBY', KEYS[4], ARGV[5])
      end
      if f < 9007199254740992 then
        fence = string.format('%.0f', f)
      else
        redis.call('DEL', KEYS[1])
      end
    end
    handed = mine and fence ~= '' and ARGV[7] == '1' and subs[2] == 0
      and string.find(next, 'h%-%d+$') ~= nil
    if own then
      here = {next, fence}
    elseif fence == '' then
      redis.call('PUBLISH', channel, ARGV[2] .. ':' .. subs[4] .. ':' .. next)
    elseif handed then
      -- Never the holder's value, which proves ownership: its SHA1, which
      -- the named waiter's acquire matches on the other nodes, and how
      -- long the holder's keys there live at most.
      redis.call('PUBLISH', channel, ARGV[2] .. ':' .. subs[4] .. ':' .. next .. ':' .. fence
        .. ':' .. redis.sha1hex(ARGV[1]) .. ':' .. ARGV[9])
    else
      redis.call('PUBLISH', channel, ARGV[2] .. ':' .. subs[4] .. ':' .. next .. ':' .. fence)
    end
    named = true
  end
end
local code = 0
if handed then
  code = 4
elseif mine and named then
  code = 2
elseif mine then
  code = 1
elseif named then
  code = 3
end
if here then
  return {code, here[1], here[2]}
end
return code
