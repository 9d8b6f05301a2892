-- Admit one job against its key's limits and the deployment's bounds, on Redis's clock, or refuse
-- it; a refusal commits nothing (router.admission.limits).
--
-- KEYS[1]  the key's token buckets (keys.key_rate), a hash: 'req' and 'tok' left, 'at' when last filled
-- KEYS[2]  the key's in-flight set (keys.key_in_flight): job ids scored by when their slot expires
-- KEYS[3]  everyone's in-flight set (keys.in_flight), the same way
-- KEYS[4]  the model's job stream (keys.job_stream)
-- KEYS[5]  the key's token counter of the day (keys.key_tokens): tokens used and reserved
-- KEYS[6]  the key's token counter of the month
-- KEYS[7]  the key's team's token counter of the day (keys.team_tokens)
-- KEYS[8]  the key's team's token counter of the month
-- ARGV[1]  the slot's name: the job's id, or a resumed stream's own (each reader holds a slot)
-- ARGV[2]  the slots' time to live (milliseconds)
-- ARGV[3]  the key's requests per minute (0: no limit)
-- ARGV[4]  the key's tokens per minute (0: no limit)
-- ARGV[5]  the tokens to reserve
-- ARGV[6]  the key's requests in flight at most (0: no limit)
-- ARGV[7]  requests in flight across the front doors at most (limits.max_in_flight)
-- ARGV[8]  jobs waiting on the model's stream at most (limits.max_queue_depth); -1: no bound (a
--          resumed stream queues nothing)
-- ARGV[9]  the workers' consumer group (keys.JOB_GROUP)
-- ARGV[10..13]  the quotas of KEYS[5..8], in tokens: the job is admitted only if what the counter
--          holds plus ARGV[5] stays within; 0: counted without a quota; -1: not counted (the
--          counter is never read or written)
-- ARGV[14] when the day of the day counters ends (unix seconds, UTC midnight)
-- ARGV[15] when the month of the month counters ends
-- ARGV[16] how long a counter is kept after its period ends (seconds, keys.QUOTA_KEPT_S)
--
-- Returns nil when admitted, or {what, retry after (s), detail} when refused (what: rpm, tpm,
-- quota_key_day, quota_key_month, quota_team_day, quota_team_month, parallel, in_flight or queue;
-- detail, for a quota: the tokens its counter holds, and its retry after is its period's end). A
-- job admitted already (redis-py retried the script after a broken connection lost its reply) is
-- admitted again at no cost.
-- The body is a function, so that admit_enqueue.lua can run it too (`--#include admit`). Jobs
-- waiting are counted by jobs_waiting.lua's `queue_of`, as every reader of a queue counts them.
--#include jobs_waiting

-- How many KEYS and ARGV admit takes: a script that includes it passes its own after them.
local ADMIT_KEYS, ADMIT_ARGV = 8, 16
-- The quota counters, in the order of KEYS[5..8], as a refusal names them.
local QUOTAS = {'quota_key_day', 'quota_key_month', 'quota_team_day', 'quota_team_month'}

-- Whether the job's tokens are counted: against the key's tokens per minute, or on a counter.
local function counts_tokens(ARGV)
    if tonumber(ARGV[4]) > 0 then
        return true
    end
    for i = 1, 4 do
        if tonumber(ARGV[9 + i]) >= 0 then
            return true
        end
    end
    return false
end

-- The refusal of the first counter whose quota `tokens` more would exceed, or nil.
local function quota_refusal(KEYS, ARGV, tokens, now)
    for i = 1, 4 do
        local quota = tonumber(ARGV[9 + i])
        if quota > 0 then
            local used = tonumber(redis.call('GET', KEYS[4 + i]) or '0')
            if used + tokens > quota then
                -- Odd counters are the day's, even ones the month's.
                local ends = tonumber(ARGV[i % 2 == 1 and 14 or 15])
                return {QUOTAS[i], tostring(math.max(0, ends - now)), tostring(used)}
            end
        end
    end
    return nil
end

-- Add `tokens` to every counted counter (negative: take them off), each kept QUOTA_KEPT_S past
-- its period's end.
local function count_tokens(KEYS, ARGV, tokens)
    for i = 1, 4 do
        if tonumber(ARGV[9 + i]) >= 0 then
            redis.call('INCRBY', KEYS[4 + i], tokens)
            local ends = tonumber(ARGV[i % 2 == 1 and 14 or 15])
            redis.call('EXPIREAT', KEYS[4 + i], ends + tonumber(ARGV[16]))
        end
    end
end

local function admit(KEYS, ARGV)
    if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
        return nil
    end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    local rpm, tpm, tokens = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
    local max_parallel = tonumber(ARGV[6])
    local requests_left, tokens_left
    local quota = quota_refusal(KEYS, ARGV, tokens, now)
    if quota then
        return quota
    end
    if rpm > 0 or tpm > 0 then
        local state = redis.call('HMGET', KEYS[1], 'req', 'tok', 'at')
        local elapsed = math.max(0, now - (tonumber(state[3]) or now))
        if rpm > 0 then
            requests_left = math.min(rpm, (tonumber(state[1]) or rpm) + elapsed * rpm / 60)
            if requests_left < 1 then
                return {'rpm', tostring((1 - requests_left) * 60 / rpm), '0'}
            end
        end
        if tpm > 0 then
            tokens_left = math.min(tpm, (tonumber(state[2]) or tpm) + elapsed * tpm / 60)
            -- A request larger than a whole minute's tokens waits for a full bucket, not forever.
            local needed = math.min(tokens, tpm)
            if tokens_left < needed then
                return {'tpm', tostring((needed - tokens_left) * 60 / tpm), tostring(math.floor(tokens_left))}
            end
        end
    end
    if max_parallel > 0 then
        redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
        if redis.call('ZCARD', KEYS[2]) >= max_parallel then
            return {'parallel', '0', tostring(max_parallel)}
        end
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
    local in_flight = redis.call('ZCARD', KEYS[3])
    if in_flight >= tonumber(ARGV[7]) then
        return {'in_flight', '0', tostring(in_flight)}
    end
    local max_queue_depth = tonumber(ARGV[8])
    if max_queue_depth >= 0 then
        local waiting = queue_of(KEYS[4], ARGV[9])
        if waiting >= max_queue_depth then
            return {'queue', '0', tostring(waiting)}
        end
    end
    local ttl_ms = tonumber(ARGV[2])
    local expires = now + ttl_ms / 1000
    if rpm > 0 or tpm > 0 then
        local full_in = 0
        redis.call('HSET', KEYS[1], 'at', tostring(now))
        if rpm > 0 then
            redis.call('HSET', KEYS[1], 'req', tostring(requests_left - 1))
            full_in = math.max(full_in, (rpm - requests_left + 1) * 60 / rpm)
        end
        if tpm > 0 then
            redis.call('HSET', KEYS[1], 'tok', tostring(tokens_left - tokens))
            full_in = math.max(full_in, (tpm - tokens_left + tokens) * 60 / tpm)
        end
        -- A bucket that would be full again is the same as no bucket.
        redis.call('PEXPIRE', KEYS[1], math.ceil(full_in * 1000) + 1000)
    end
    if max_parallel > 0 then
        redis.call('ZADD', KEYS[2], expires, ARGV[1])
        if redis.call('PTTL', KEYS[2]) < ttl_ms then
            redis.call('PEXPIRE', KEYS[2], ttl_ms)
        end
    end
    redis.call('ZADD', KEYS[3], expires, ARGV[1])
    if redis.call('PTTL', KEYS[3]) < ttl_ms then
        redis.call('PEXPIRE', KEYS[3], ttl_ms)
    end
    count_tokens(KEYS, ARGV, tokens)
    return false
end
return admit(KEYS, ARGV)
