-- Give up a job whose streamed client left and did not come back within the resume grace
-- (router.queue.enqueue): unless a reader is back, or another left since and waits its own grace,
-- leave its cancel mark (unless it ended) and delete its results and record at once, instead of
-- keeping them until they expire for a client that will not come.
--
-- KEYS[1]  the job record (keys.job_record): fields 'readers', 'leaves' and 'done'
--          (keys.READERS_FIELD, keys.LEAVES_FIELD, keys.DONE_FIELD)
-- KEYS[2]  the job's result stream (keys.result_stream)
-- KEYS[3]  the job's cancel mark (keys.cancel_mark)
-- ARGV[1]  the record's 'leaves' as the leaving reader counted it
-- ARGV[2]  the cancel mark's TTL (seconds)
--
-- Returns 1 when the job was given up, 0 when it still has (or may get) a reader.
local state = redis.call('HMGET', KEYS[1], 'readers', 'leaves', 'done')
if tonumber(state[1] or '0') > 0 then
    return 0
end
if state[2] and state[2] ~= ARGV[1] then
    return 0
end
if not state[3] then
    redis.call('SET', KEYS[3], '1', 'EX', ARGV[2])
end
redis.call('UNLINK', KEYS[2], KEYS[1])
return 1
