-- Acknowledge a claim: trim the first ARGV[2] items and end the claim, but only
-- if the claim is still ours. A worker whose claim expired (stalled, SIGSTOPped)
-- must not trim what the next claimant queued or has not sent yet.
-- KEYS[1] owner key  KEYS[2] outbox list   ARGV[1] claim token  ARGV[2] count
-- Returns 1 when acknowledged, 0 when the claim was no longer held (fenced).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local n = tonumber(ARGV[2])
if n > 0 then
  redis.call('LTRIM', KEYS[2], n, -1)
end
redis.call('DEL', KEYS[1])
return 1
