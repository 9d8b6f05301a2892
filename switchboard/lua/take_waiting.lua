-- Take from a model's job stream the jobs no worker has taken yet (router.queue.move), so that
-- another model's stream can queue them: a route that rolls its canary back moves the canary's
-- waiting jobs to the stable version. A worker reads the stream with XREADGROUP, which Redis runs
-- between scripts, never during one: every entry after the group's last delivered id is one that
-- no worker has seen, and once deleted here none will.
--
-- KEYS[1]  the model's job stream (keys.job_stream)
-- ARGV[1]  the workers' consumer group (keys.JOB_GROUP)
-- ARGV[2]  the most entries to take
--
-- Returns the taken entries' `job` fields (keys.JOB_FIELD), oldest first.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {}
end
local start = '-'
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local fields = {}
    for i = 1, #group, 2 do
        fields[group[i]] = group[i + 1]
    end
    if fields['name'] == ARGV[1] then
        start = '(' .. fields['last-delivered-id']
    end
end
local taken = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[2])) do
    local fields = entry[2]
    for i = 1, #fields, 2 do
        if fields[i] == 'job' then
            taken[#taken + 1] = fields[i + 1]
        end
    end
    redis.call('XDEL', KEYS[1], entry[1])
end
return taken
