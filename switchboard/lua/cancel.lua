-- Leave a job's cancel mark, unless the job has ended.
--
-- KEYS[1]  the job's cancel mark (keys.cancel_mark)
-- KEYS[2]  the job's record (keys.job_record)
-- ARGV[1]  the mark's TTL in seconds (keys.CANCEL_TTL_S)
-- ARGV[2]  the record's field set once the job's last chunk was written (keys.DONE_FIELD)
--
-- Returns 1 when the mark was left, 0 when the job had ended (a mark then would linger for nobody).
if redis.call('HGET', KEYS[2], ARGV[2]) then
    return 0
end
redis.call('SET', KEYS[1], '1', 'EX', ARGV[1])
return 1
