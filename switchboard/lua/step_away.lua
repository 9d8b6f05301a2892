-- Count a streamed reader out of a job's readers when it left mid-stream and its client may resume
-- (router.queue.enqueue): its results and record are kept until they expire, or the job is given up.
-- Only a record that exists is touched: one that is gone (Redis restarted without it) stays gone,
-- since a record brought back would make a lost job look alive to every front door.
--
-- KEYS[1]  the job record (keys.job_record): fields 'readers' and 'leaves' (keys.READERS_FIELD,
--          keys.LEAVES_FIELD)
-- KEYS[2]  the job's result stream (keys.result_stream)
-- ARGV[1]  how long both are kept (seconds)
--
-- Returns the job's leaves so far (give_up.lua compares them), or 0 when its record is gone.
redis.call('EXPIRE', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
end
redis.call('HINCRBY', KEYS[1], 'readers', -1)
local leaves = redis.call('HINCRBY', KEYS[1], 'leaves', 1)
redis.call('EXPIRE', KEYS[1], ARGV[1])
return leaves
