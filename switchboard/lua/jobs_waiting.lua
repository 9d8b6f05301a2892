-- For each job stream: how many jobs no worker has taken, the entry id of the oldest of them, and
-- how many jobs it holds in all (waiting or taken).
--
-- KEYS     the job streams (keys.job_stream), one per model
-- ARGV[1]  the workers' consumer group (keys.JOB_GROUP)
--
-- Returns one {waiting, oldest entry id, length} per stream, in the order of KEYS; the id is '' when
-- no job waits. The count is `queue_of`, the one definition of a job waiting: the admission script
-- (admit.lua) includes it (`--#include jobs_waiting`) for its queue bound.

-- The stream `key`'s jobs that no worker of `group` has taken, the id of the last entry the group
-- was handed ('0-0' if none), and the stream's length. A taken job is pending in the group until it
-- ends, then acknowledged and deleted, so waiting = length - pending (never below 0); a stream no
-- worker has joined yet has no group, and every entry in it waits.
local function queue_of(key, group)
  local length = redis.call('XLEN', key)
  local last, pending = '0-0', 0
  if length > 0 then
    local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
    if ok then
      for _, found in ipairs(groups) do
        local fields = {}
        for j = 1, #found, 2 do fields[found[j]] = found[j + 1] end
        if fields['name'] == group then
          last, pending = fields['last-delivered-id'], fields['pending']
        end
      end
    end
  end
  return math.max(0, length - pending), last, length
end

local function jobs_waiting(KEYS, ARGV)
  local out = {}
  for i, key in ipairs(KEYS) do
    local waiting, last, length = queue_of(key, ARGV[1])
    local oldest = ''
    if waiting > 0 then
      local first = redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)
      if #first > 0 then oldest = first[1][1] end
    end
    out[i] = {waiting, oldest, length}
  end
  return out
end
return jobs_waiting(KEYS, ARGV)
