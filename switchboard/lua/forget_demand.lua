-- Remove models from the demand index, each only if its token is still the one the caller read
-- (switchboard.demand): an enqueue or operator request that noted the model since then wrote a new
-- token, and its entry stays.
--
-- KEYS[1]  the demand index (keys.demand_index): model name → token of its last note
-- ARGV     pairs: a model's name, then the token read for it
--
-- Returns how many entries were removed.
local removed = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return removed
