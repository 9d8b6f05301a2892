-- Read a job's record for a client resuming its stream, and count the client in as a reader
-- (router.queue.enqueue). Only a resume that is served counts: one refused here changes nothing.
--
-- KEYS[1]  the job record (keys.job_record): fields 'tenant', 'readers', 'resumes' and 'model'
--          (keys.TENANT_FIELD, keys.READERS_FIELD, keys.RESUMES_FIELD, keys.MODEL_RECORD_FIELD)
-- KEYS[2]  the job's result stream (keys.result_stream)
-- ARGV[1]  the record's TTL at least (seconds)
-- ARGV[2]  the last result stream entry the client had (a valid stream id: the caller checks), or
--          '0-0' for a client that counted the events it had: it is relayed the answer from its start
-- ARGV[3]  the identity of the key resuming the stream ("" without keys)
--
-- Returns {'gone'} when the job's results are gone or the job was sent with another key (the two
-- read the same, so that another key's job is not revealed), {'unknown_entry'} when ARGV[2] is no
-- entry of the job's results (no event ever carried that id), else {'found', entries, model}: the
-- result stream's entries up to ARGV[2] (the relay reads them again to pick up where the client's
-- stream stopped), and the model the job was queued for (a route's caller keeps its version even
-- when the weights moved it since).
if redis.call('EXISTS', KEYS[2]) == 0 or redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[3] then
    return {'gone'}
end
if ARGV[2] ~= '0-0' and #redis.call('XRANGE', KEYS[2], ARGV[2], ARGV[2]) == 0 then
    return {'unknown_entry'}
end
redis.call('HINCRBY', KEYS[1], 'readers', 1)
redis.call('HINCRBY', KEYS[1], 'resumes', 1)
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return {'found', redis.call('XRANGE', KEYS[2], '-', ARGV[2]), redis.call('HGET', KEYS[1], 'model')}
