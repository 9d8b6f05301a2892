-- Give an admitted job's slots back and settle its tokens with what it used
-- (router.admission.limits).
--
-- KEYS[1]  the key's token buckets (keys.key_rate), a hash: 'tok' left, 'at' when last filled
-- KEYS[2]  the key's in-flight set (keys.key_in_flight)
-- KEYS[3]  everyone's in-flight set (keys.in_flight)
-- KEYS[4..]  the token counters the job reserved on at admission (keys.key_tokens,
--          keys.team_tokens: those of the day and month it was admitted in), if any
-- ARGV[1]  the slot's name (the job's id, or a resumed stream's own)
-- ARGV[2]  the tokens to give back (negative: to take)
-- ARGV[3]  the key's tokens per minute (0: no limit)
--
-- Returns nothing. The slots go first: they are removals, which a Redis out of memory still accepts.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local refund, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
if refund == 0 then
    return false
end
for i = 4, #KEYS do
    local counted = tonumber(redis.call('GET', KEYS[i]))
    -- A counter that expired (kept long past its period) is not written again: it would never
    -- expire. One is never settled below nothing.
    if counted then
        redis.call('DECRBY', KEYS[i], math.min(refund, counted))
    end
end
if tpm == 0 then
    return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tokens_left = tonumber(redis.call('HGET', KEYS[1], 'tok'))
if not tokens_left then
    -- The bucket expired, that is, it was full.
    tokens_left = tpm
    redis.call('HSET', KEYS[1], 'at', tostring(now))
end
tokens_left = math.min(tpm, tokens_left + refund)
redis.call('HSET', KEYS[1], 'tok', tostring(tokens_left))
local full_in_ms = math.ceil((tpm - tokens_left) * 60000 / tpm) + 1000
if redis.call('PTTL', KEYS[1]) < full_in_ms then
    redis.call('PEXPIRE', KEYS[1], full_in_ms)
end
return false
