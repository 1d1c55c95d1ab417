-- A batch of one route's scores in one atomic step: compare-and-set the route's
-- state and the noise floors the batch touched, mark every pair seen, publish the
-- latest signed command and queue the outbox (at most one transition per batch:
-- the batch stops at it). All keys carry the route's hash tag: one slot.
-- KEYS[1] state  KEYS[2] command  KEYS[3] outbox  KEYS[4] stats
-- KEYS[5 .. 4+F] noise floors   KEYS[5+F ..] seen keys
-- ARGV[1] F (floors)  ARGV[2] S (seen keys)  ARGV[3] seen TTL (s)  ARGV[4] duplicates
-- ARGV[5] state version  ARGV[6] state JSON ('' = unchanged)  ARGV[7] command ('' = none)
-- ARGV[8 .. 7+2F] floor version, floor JSON ('' = unchanged) per floor
-- ARGV[8+2F ..] outbox items
local f = tonumber(ARGV[1])
local s = tonumber(ARGV[2])
for i = 5 + f, 4 + f + s do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {'conflict', 0}
  end
end
if ARGV[6] ~= '' then
  local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
  if version ~= tonumber(ARGV[5]) then
    return {'conflict', version}
  end
end
for j = 0, f - 1 do
  if ARGV[9 + 2 * j] ~= '' then
    local fv = tonumber(redis.call('HGET', KEYS[5 + j], 'v') or '0')
    if fv ~= tonumber(ARGV[8 + 2 * j]) then
      return {'conflict', fv}
    end
  end
end
local version = 0
if ARGV[6] ~= '' then
  version = tonumber(ARGV[5]) + 1
  redis.call('HSET', KEYS[1], 'v', version, 's', ARGV[6])
end
for j = 0, f - 1 do
  if ARGV[9 + 2 * j] ~= '' then
    redis.call('HSET', KEYS[5 + j], 'v', tonumber(ARGV[8 + 2 * j]) + 1, 's', ARGV[9 + 2 * j])
  end
end
for i = 5 + f, 4 + f + s do
  redis.call('SET', KEYS[i], '1', 'EX', tonumber(ARGV[3]))
end
if tonumber(ARGV[4]) > 0 then
  redis.call('HINCRBY', KEYS[4], 'duplicates', tonumber(ARGV[4]))
end
if ARGV[7] ~= '' then
  redis.call('SET', KEYS[2], ARGV[7])
end
for i = 8 + 2 * f, #ARGV do
  redis.call('RPUSH', KEYS[3], ARGV[i])
end
return {'ok', version}
