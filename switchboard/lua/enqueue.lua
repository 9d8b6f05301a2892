-- Put a job on its model's stream (router.queue.enqueue), unless the model's last load failed.
--
-- A model whose last load failed takes no job: the failure's payload comes back instead, and the
-- request is answered at once. Otherwise the job goes on its stream with its record. A job whose
-- record exists is queued already: redis-py retries a command whose reply a broken connection
-- lost, and the retry must not queue the job twice. The script touches one model's keys and the
-- job's record; the demand index and the pokes follow it in the same pipeline.
--
-- KEYS[1]  the model's failure mark (keys.load_failure)
-- KEYS[2]  the model's job stream (keys.job_stream); its entry's field 'job' (keys.JOB_FIELD)
-- KEYS[3]  the job record (keys.job_record): fields 'tenant' and 'readers' (keys.TENANT_FIELD,
--          keys.READERS_FIELD)
-- ARGV[1]  the encoded job
-- ARGV[2]  the job stream's TTL (seconds)
-- ARGV[3]  the API key that sent the job ("" without keys)
-- ARGV[4]  the job record's TTL (seconds)
--
-- Returns the model's load failure (encoded LoadFailure), or nil once the job is queued.
local failure = redis.call('GET', KEYS[1])
if failure then
    return failure
end
if redis.call('EXISTS', KEYS[3]) == 1 then
    return false
end
redis.call('HSET', KEYS[3], 'tenant', ARGV[3], 'readers', 1)
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('XADD', KEYS[2], '*', 'job', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return false
