-- KEYS: waiting marker[, lock key]. ARGV: life ms[, claim[, "drop",
-- the claimant's kept value]].
-- Without a claim: the resource is waited for, at least that long (a
-- claim there stays, living that long). With one ('c:{ms}:{claimant}'):
-- the marker is the claim, replacing any other (the semaphore's waiter
-- whose turn it is). With "drop": the claim, if
-- still this one, goes back to a plain marker for the rest of its life,
-- and a key a release kept for the claimant ('r:{claimant}', the lock
-- key) that it did not take is deleted: the slot is free again.
if ARGV[2] then
  if ARGV[3] == 'drop' then
    if redis.call('GET', KEYS[1]) == ARGV[2] then
      local left = redis.call('PTTL', KEYS[1])
      if left > 0 then
        redis.call('SET', KEYS[1], '1', 'PX', left)
      end
    end
    if KEYS[2] and redis.call('GET', KEYS[2]) == ARGV[4] then
      redis.call('DEL', KEYS[2])
    end
    return 1
  end
  -- Never shorter than the marker the other waiters keep.
  redis.call('SET', KEYS[1], ARGV[2], 'PX', math.max(tonumber(ARGV[1]), redis.call('PTTL', KEYS[1])))
  return 1
end
local left = redis.call('PTTL', KEYS[1])
if left < tonumber(ARGV[1]) then
  if left > 0 and string.sub(redis.call('GET', KEYS[1]), 1, 2) == 'c:' then
    -- A claim stays a claim (its claimant takes it back).
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
  else
    redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
  end
end
return 1
