-- One atomic breaker step without a pair (a tick, a manual command, a seeded noise
-- floor): compare-and-set the state, publish the latest signed command for
-- gateways, and queue the outbox. Scores fold through fold_batch.lua, which also
-- dedupes by pair. Every key belongs to one route and carries its hash tag: one
-- slot, Cluster-safe.
-- KEYS[1] state hash (or noise floor hash)   KEYS[2] command key   KEYS[3] outbox list
-- ARGV[1] expected version  ARGV[2] new state JSON
-- ARGV[3] signed command envelope ('' for none)  ARGV[4..] outbox items
local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if version ~= tonumber(ARGV[1]) then
  return {'conflict', version}
end
redis.call('HSET', KEYS[1], 'v', version + 1, 's', ARGV[2])
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[3])
end
for i = 4, #ARGV do
  redis.call('RPUSH', KEYS[3], ARGV[i])
end
return {'ok', version + 1}
