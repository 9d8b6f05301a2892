-- Admit a client resuming a job's stream (`Last-Event-ID`) against its key's limits and the
-- deployment's bounds (admit.lua), reserving the tokens of the job's answer as it was queued: the
-- estimate its record keeps, never one made from the request the client re-sent, which it may
-- change (router.admission.limits).
--
-- KEYS[1..8]   admit.lua's KEYS: the key's token buckets, its in-flight set, everyone's in-flight
--              set, the model's job stream (unread: a resume queues nothing), the token counters of
--              the key and its team
-- KEYS[9]      the job record (keys.job_record): fields 'tenant' and 'answer_tokens'
--              (keys.TENANT_FIELD, keys.ANSWER_TOKENS_FIELD)
-- ARGV[1..16]  admit.lua's ARGV; ARGV[5], the tokens to reserve, counts only where the record has
--              no estimate of this key's job: the job is unknown or another key's (resume.lua then
--              refuses the client, and the reservation is given back, the same for both so that
--              another key's job is not revealed), or it was queued before records kept one
-- ARGV[17]     the identity of the key resuming (`Caller.owner`; "" without keys)
--
-- Returns {'admitted', tokens reserved}, or {'refused', what, retry after (s), detail, tokens} as
-- admit.lua refuses (nothing committed).
--#include admit
local args = {}
for i = 1, ADMIT_ARGV do
    args[i] = ARGV[i]
end
if counts_tokens(ARGV) then
    local record = redis.call('HMGET', KEYS[ADMIT_KEYS + 1], 'tenant', 'answer_tokens')
    if record[1] == ARGV[ADMIT_ARGV + 1] and record[2] then
        args[5] = record[2]
    end
end
local admit_keys = {}
for i = 1, ADMIT_KEYS do
    admit_keys[i] = KEYS[i]
end
local refusal = admit(admit_keys, args)
if refusal then
    return {'refused', refusal[1], refusal[2], refusal[3], args[5]}
end
return {'admitted', args[5]}
