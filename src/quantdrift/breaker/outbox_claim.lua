-- Claim a route's outbox: take the owner key (NX, expiring) and read the items in
-- one step. Returns false when another worker holds the claim.
-- KEYS[1] owner key  KEYS[2] outbox list   ARGV[1] claim token  ARGV[2] ttl (ms)
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local items = redis.call('LRANGE', KEYS[2], 0, -1)
if #items == 0 then
  redis.call('DEL', KEYS[1])
end
return items
