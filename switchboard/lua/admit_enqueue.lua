#!lua
-- (The shebang, without flags, has Redis 7 refuse the script at its start while Redis is over
-- maxmemory, as it refuses a write: admitted and queued together, a job must not slip into a full
-- Redis because the admission's own writes were allowed.)
--
-- Admit a job against its key's limits and the deployment's bounds (admit.lua), and queue it
-- (enqueue.lua), in one round trip (router.queue.run): a request's way into the queue costs the
-- front door one call instead of two. Every check and every answer of the two scripts holds.
--
-- KEYS[1..8]   admit.lua's KEYS: the key's token buckets, its in-flight set, everyone's in-flight
--              set, the model's job stream, the token counters of the key and its team
-- KEYS[9..13]  enqueue.lua's KEYS (KEYS[11]: the job record)
-- ARGV[1..16]  admit.lua's ARGV (ARGV[1], the slot, is the job's id)
-- ARGV[17]     the tokens the job's answer is estimated at, kept in its record ('answer_tokens',
--              keys.ANSWER_TOKENS_FIELD): what a client resuming its stream reserves (admit_resume.lua)
-- ARGV[18..]   enqueue.lua's ARGV (never "moved": a moved job was admitted long ago)
--
-- Returns nil once the job is admitted and queued; {'refused', what, retry after (s), detail} when
-- admission refuses it (nothing committed, as admit.lua); {'load_failed', encoded LoadFailure} when
-- its model's last load failed: then the slots it took are given back at once, and so are the
-- tokens it reserved on its quotas' counters (it used none); what it took of the key's rates stays
-- taken, as a ticket released unused would leave them (release.lua with no refund). A call sent again (redis-py retried it after a lost reply) is admitted again at no cost
-- and queues nothing twice.
--#include admit
--#include enqueue
local function slice(list, first, last)
    local part = {}
    for i = first, last or #list do
        part[#part + 1] = list[i]
    end
    return part
end
local refusal = admit(slice(KEYS, 1, ADMIT_KEYS), slice(ARGV, 1, ADMIT_ARGV))
if refusal then
    return {'refused', refusal[1], refusal[2], refusal[3]}
end
local failure = enqueue(slice(KEYS, ADMIT_KEYS + 1), slice(ARGV, ADMIT_ARGV + 2))
if failure then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    count_tokens(KEYS, ARGV, -tonumber(ARGV[5]))
    return {'load_failed', failure}
end
redis.call('HSET', KEYS[ADMIT_KEYS + 3], 'answer_tokens', ARGV[ADMIT_ARGV + 1])
return false
