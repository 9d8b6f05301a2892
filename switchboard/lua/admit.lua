-- Admit one job against its key's limits and the deployment's bounds, on Redis's clock, or refuse
-- it; a refusal commits nothing (router.admission.limits).
--
-- KEYS[1]  the key's token buckets (keys.key_rate), a hash: 'req' and 'tok' left, 'at' when last filled
-- KEYS[2]  the key's in-flight set (keys.key_in_flight): job ids scored by when their slot expires
-- KEYS[3]  everyone's in-flight set (keys.in_flight), the same way
-- KEYS[4]  the model's job stream (keys.job_stream)
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
--
-- Returns nil when admitted, or {what, retry after (s), detail} when refused (what: rpm, tpm,
-- parallel, in_flight or queue). A job admitted already (redis-py retried the script after a broken
-- connection lost its reply) is admitted again at no cost.
-- The body is a function, so that admit_enqueue.lua can run it too (`--#include admit`). Jobs
-- waiting are counted by jobs_waiting.lua's `queue_of`, as every reader of a queue counts them.
--#include jobs_waiting
local function admit(KEYS, ARGV)
    if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
        return nil
    end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    local rpm, tpm, tokens = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
    local max_parallel = tonumber(ARGV[6])
    local requests_left, tokens_left
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
    return false
end
return admit(KEYS, ARGV)
