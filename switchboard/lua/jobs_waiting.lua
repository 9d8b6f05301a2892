-- For each model: how many of its interactive jobs (the priority, default and flex tiers) no worker
-- has taken, the entry id of the oldest of them, how many jobs its streams hold in all (waiting or
-- taken, every tier), and how many of its batch lines wait.
--
-- KEYS     each model's job streams (keys.job_streams over wire.TIERS), ARGV[2] of them per model,
--          in the tiers' order; the last is its batch tier's
-- ARGV[1]  the workers' consumer group (keys.JOB_GROUP)
-- ARGV[2]  streams per model
--
-- Returns one {waiting, oldest entry id, length, batch waiting} per model, in the order of KEYS; the
-- id is '' when no interactive job waits. Batch lines are counted apart: alone they neither load a
-- model nor keep it warm. The count of one stream is `queue_of`, the one definition of a job
-- waiting: the admission script (admit.lua) includes it (`--#include jobs_waiting`) for its queue
-- bound.

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

-- Whether stream entry id `a` comes before `b` ('<ms>-<seq>').
local function before(a, b)
  local a_ms, a_seq = string.match(a, '(%d+)-(%d+)')
  local b_ms, b_seq = string.match(b, '(%d+)-(%d+)')
  if a_ms ~= b_ms then return tonumber(a_ms) < tonumber(b_ms) end
  return tonumber(a_seq) < tonumber(b_seq)
end

local function oldest_waiting(key, last)
  local first = redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)
  if #first > 0 then return first[1][1] end
  return ''
end

local function jobs_waiting(KEYS, ARGV)
  local per_model = tonumber(ARGV[2])
  local out = {}
  for first = 1, #KEYS, per_model do
    local waiting, oldest, length, batch = 0, '', 0, 0
    for i = first, first + per_model - 1 do
      local key_waiting, last, key_length = queue_of(KEYS[i], ARGV[1])
      length = length + key_length
      if i == first + per_model - 1 then
        batch = key_waiting
      elseif key_waiting > 0 then
        waiting = waiting + key_waiting
        local id = oldest_waiting(KEYS[i], last)
        if id ~= '' and (oldest == '' or before(id, oldest)) then oldest = id end
      end
    end
    out[#out + 1] = {waiting, oldest, length, batch}
  end
  return out
end
return jobs_waiting(KEYS, ARGV)
