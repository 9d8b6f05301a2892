-- Put a job back at the end of its stream as a new entry that remembers how often it was taken.
--
-- KEYS[1]  the job stream
-- ARGV[1]  the entry id of the job
-- ARGV[2]  the encoded job
-- ARGV[3]  how many workers took the job before
-- ARGV[4]  the consumer group
--
-- Returns 1 when the job was put back, 0 when its entry is no longer in the stream (it was
-- acknowledged meanwhile: its last chunk was written, so it is finished). Fields of the new entry:
-- `job` and `taken` (keys.JOB_FIELD, keys.TAKEN_FIELD).
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  redis.call('XACK', KEYS[1], ARGV[4], ARGV[1])
  return 0
end
redis.call('XADD', KEYS[1], '*', 'job', ARGV[2], 'taken', ARGV[3])
redis.call('XACK', KEYS[1], ARGV[4], ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
