-- One atomic breaker step: compare-and-set the route's state, mark the pair seen,
-- publish the latest signed command for gateways, and queue the outbox.
-- Every key belongs to one route and carries its hash tag: one slot, Cluster-safe.
-- KEYS[1] state hash (or noise floor hash)   KEYS[2] seen key ('' for none)
-- KEYS[3] command key   KEYS[4] outbox list   KEYS[5] route stats hash
-- ARGV[1] expected version  ARGV[2] new state JSON  ARGV[3] seen TTL (s)
-- ARGV[4] signed command envelope ('' for none)  ARGV[5..] outbox items
if KEYS[2] ~= '' and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[5], 'duplicates', 1)
  return {'dup', 0}
end
local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if version ~= tonumber(ARGV[1]) then
  return {'conflict', version}
end
redis.call('HSET', KEYS[1], 'v', version + 1, 's', ARGV[2])
if KEYS[2] ~= '' then
  redis.call('SET', KEYS[2], '1', 'EX', tonumber(ARGV[3]))
end
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[3], ARGV[4])
end
for i = 5, #ARGV do
  redis.call('RPUSH', KEYS[4], ARGV[i])
end
return {'ok', version + 1}
