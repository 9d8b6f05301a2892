-- For each job stream: how many jobs no worker has taken, the entry id of the oldest of them, and
-- how many jobs it holds in all (waiting or taken).
--
-- KEYS     the job streams (keys.job_stream), one per model
-- ARGV[1]  the workers' consumer group (keys.JOB_GROUP)
--
-- Returns one {waiting, oldest entry id, length} per stream, in the order of KEYS; the id is '' when
-- no job waits. A taken job is pending in the group until it ends, then acknowledged and deleted, so
-- waiting = length - pending (never below 0); a stream no worker has joined yet has no group, and
-- every entry in it waits. The admission script (admit.lua) counts a stream's waiting jobs the same
-- way inside its own atomic check.
local out = {}
for i, key in ipairs(KEYS) do
  local waiting, oldest = 0, ''
  local length = redis.call('XLEN', key)
  if length > 0 then
    local last, pending = '0-0', 0
    local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
    if ok then
      for _, group in ipairs(groups) do
        local fields = {}
        for j = 1, #group, 2 do fields[group[j]] = group[j + 1] end
        if fields['name'] == ARGV[1] then
          last, pending = fields['last-delivered-id'], fields['pending']
        end
      end
    end
    waiting = math.max(0, length - pending)
    if waiting > 0 then
      local first = redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)
      if #first > 0 then oldest = first[1][1] end
    end
  end
  out[i] = {waiting, oldest, length}
end
return out
