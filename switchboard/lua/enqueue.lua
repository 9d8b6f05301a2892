-- Put a job on its model's stream in one round trip (router.queue.enqueue).
--
-- A model whose last load failed takes no new job: the failure's payload comes back instead, and the
-- request is answered at once. Otherwise the job goes on its stream with its record, its model is
-- noted in the demand index under the job's id (after the job: see switchboard.demand), and the
-- model controllers are poked. (The front door's result reader needs no poke: the job's chunks come
-- to its inbox, router.queue.results.) A job whose record exists is queued already: redis-py retries a command whose reply a broken connection lost, and the retry must not
-- queue the job twice.
--
-- Keys: one model's (KEYS[1], KEYS[2]), the job's record, and deployment-wide ones (the demand
-- index and stream); never another model's.
--
-- KEYS[1]  the model's failure mark (keys.load_failure)
-- KEYS[2]  the model's job stream (keys.job_stream); its entry's field 'job' (keys.JOB_FIELD)
-- KEYS[3]  the job record (keys.job_record): fields 'tenant', 'readers' and 'model'
--          (keys.TENANT_FIELD, keys.READERS_FIELD, keys.MODEL_RECORD_FIELD)
-- KEYS[4]  the demand index (keys.demand_index): model name → token of its last note
-- KEYS[5]  the demand stream (keys.demand_stream); its entry's field 'm' (keys.MODEL_FIELD)
-- ARGV[1]  the encoded job
-- ARGV[2]  the job stream's TTL (seconds)
-- ARGV[3]  the model's name
-- ARGV[4]  the job's id (the token of the model's note)
-- ARGV[5]  the demand index's TTL (seconds)
-- ARGV[6]  the demand stream's approximate MAXLEN
-- ARGV[7]  the demand stream's TTL (seconds)
-- ARGV[8]  the API key that sent the job, by its identity (`Caller.owner`; "" without keys)
-- ARGV[9]  the job record's TTL (seconds)
-- ARGV[10] optional: "moved", for a job taken from another model's stream that no worker had taken
--          (router.queue.move): its record exists already and is kept, its model changed; a move
--          sent again (a retried command) queues nothing. It is queued even while the model's last
--          load failed: its client waits for the model's next load rather than lose its job
--
-- Returns the model's load failure (encoded LoadFailure), or nil once the job is queued.
-- The body is a function, so that admit_enqueue.lua can run it too (`--#include enqueue`).
local function enqueue(KEYS, ARGV)
    if ARGV[10] == 'moved' then
        if redis.call('HGET', KEYS[3], 'model') == ARGV[3] then
            return false
        end
        redis.call('HSET', KEYS[3], 'model', ARGV[3])
    else
        local failure = redis.call('GET', KEYS[1])
        if failure then
            return failure
        end
        if redis.call('EXISTS', KEYS[3]) == 1 then
            return false
        end
        redis.call('HSET', KEYS[3], 'tenant', ARGV[8], 'readers', 1, 'model', ARGV[3])
        redis.call('EXPIRE', KEYS[3], ARGV[9])
    end
    redis.call('XADD', KEYS[2], '*', 'job', ARGV[1])
    redis.call('EXPIRE', KEYS[2], ARGV[2])
    -- The index's lifetime is renewed when a model joins it: a model stays in it only while its stream
    -- holds jobs, so models keep joining it while there is traffic at all.
    if redis.call('HSET', KEYS[4], ARGV[3], ARGV[4]) == 1 then
        redis.call('EXPIRE', KEYS[4], ARGV[5])
    end
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*', 'm', ARGV[3])
    redis.call('EXPIRE', KEYS[5], ARGV[7])
    return false
end
return enqueue(KEYS, ARGV)
