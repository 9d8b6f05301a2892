-- Take up to a count of one model's jobs, its tiers' streams read in order (workers.jobs.reads): a
-- job of a tier is taken before any of the tiers after it, in one step between the other workers'
-- reads.
--
-- KEYS       the model's job streams to read (keys.job_stream), in the order their jobs are served
-- ARGV[1]    the workers' consumer group (keys.JOB_GROUP)
-- ARGV[2]    this worker (the group's consumer)
-- ARGV[3]    the most jobs to take in all
-- ARGV[3+i]  the most jobs to take from KEYS[i]
--
-- Returns one reply per stream, in the order of KEYS: its entries as XREADGROUP gives them
-- ({id, {field, value, ...}} each, possibly none), or the string 'NOGROUP' when the stream has no
-- consumer group (it expired, or Redis restarted empty): the caller makes it again.
local left = tonumber(ARGV[3])
local out = {}
for i, key in ipairs(KEYS) do
    local count = math.min(left, tonumber(ARGV[3 + i]))
    local entries = {}
    if count > 0 then
        local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', key, '>')
        if type(reply) == 'table' and reply.err then
            if not string.find(reply.err, 'NOGROUP') then
                return redis.error_reply(reply.err)
            end
            entries = 'NOGROUP'
        elseif reply then
            entries = reply[1][2]
            left = left - #entries
        end
    end
    out[i] = entries
end
return out
