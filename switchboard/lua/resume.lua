-- Read a job's record for a client resuming its stream, and count the client in as a reader
-- (router.queue.enqueue).
--
-- KEYS[1]  the job record (keys.job_record): fields 'tenant', 'readers' and 'resumes'
--          (keys.TENANT_FIELD, keys.READERS_FIELD, keys.RESUMES_FIELD)
-- KEYS[2]  the job's result stream (keys.result_stream)
-- ARGV[1]  the record's TTL at least (seconds)
-- ARGV[2]  the last result stream entry the client had
--
-- Returns nil when the job's results are gone, else the tenant that sent the job and the result
-- stream's entries up to ARGV[2] (the relay reads them again to pick up where the client's stream
-- stopped).
if redis.call('EXISTS', KEYS[2]) == 0 or redis.call('EXISTS', KEYS[1]) == 0 then
    return false
end
redis.call('HINCRBY', KEYS[1], 'readers', 1)
redis.call('HINCRBY', KEYS[1], 'resumes', 1)
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return {redis.call('HGET', KEYS[1], 'tenant'), redis.call('XRANGE', KEYS[2], '-', ARGV[2])}
