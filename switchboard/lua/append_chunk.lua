-- Append one result chunk of a job; tell whether its client still reads.
--
-- KEYS[1]  the job's result stream
-- KEYS[2]  the job's cancel mark
-- KEYS[3]  the job stream to acknowledge on (the result stream again when nothing is acknowledged)
-- KEYS[4]  the job record
-- KEYS[5]  the inbox of the front door that queued the job (the result stream again for none)
-- ARGV[1]  the encoded chunk
-- ARGV[2]  the result stream's TTL (seconds)
-- ARGV[3]  "1" if the chunk may create the result stream
-- ARGV[4]  the job's entry id to acknowledge ("" for none)
-- ARGV[5]  the consumer group
-- ARGV[6]  the chunk's position in the results (-1: after the last one)
-- ARGV[7]  the writer (the worker's id)
-- ARGV[8]  "1" for the first chunk this writer writes for the job
-- ARGV[9]  the inbox's approximate MAXLEN ("" for no inbox)
-- ARGV[10] the inbox's TTL (seconds)
--
-- Returns 0 (written, or found written by an earlier try, and its client still reads), 1 (nobody
-- reads the job's results any more: its cancel mark, or its result stream deleted) or 2 (another
-- worker writes the job's results now: it took the job over).
--
-- A chunk at position n is entry `0-(n+1)`, so appends are idempotent: a flush retried after a
-- lost reply (by this writer or by redis-py) finds its chunk there, written by itself, and writes
-- nothing twice. They are fenced too: a worker that stalled past its heartbeat, while another took
-- its job over, finds the other's chunks at or after its position and stops (2); only a writer's
-- first chunk for the job may follow another writer's (that is the takeover). Only a job's first
-- chunk may create its result stream: a stream the front door deleted (its client left, or it read
-- the last chunk) is never brought back by a late chunk. And only while the job's record exists: a
-- job whose record is gone (Redis restarted without it, or it expired) has nobody to read it, and
-- results created for it would be generated for nobody and kept until they expire. Fields: `c` the chunk, `w` its writer,
-- and on a writer's first chunk `m` the model that wrote it (keys.CHUNK_FIELD, keys.WRITER_FIELD,
-- keys.SERVED_BY_FIELD); `done` on the job record (keys.DONE_FIELD).
--
-- A chunk written is copied to the front door's inbox (router.queue.results): its result stream `r`
-- and entry id `e` (keys.INBOX_STREAM_FIELD, keys.INBOX_ENTRY_FIELD), and the entry's `c` and `m`.
-- The front door reads every job's chunks there in one read of one key; the result stream stays the
-- record of the answer (a resumed stream reads it, and so does a reader that misses a copy).
local function writer_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'w' then return fields[i + 1] end
  end
  return false
end
local status = 0
if redis.call('EXISTS', KEYS[1]) == 0 and (ARGV[3] ~= '1' or redis.call('EXISTS', KEYS[4]) == 0) then
  status = 1
else
  local last, last_writer = 0, false
  local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #top > 0 then
    last = tonumber(string.match(top[1][1], '%-(%d+)$'))
    last_writer = writer_of(top[1][2])
  end
  local seq = tonumber(ARGV[6])
  local position = seq + 1
  if seq < 0 then
    position = last + 1
  end
  if position <= last then
    local there = redis.call('XRANGE', KEYS[1], '0-' .. position, '0-' .. position)
    if #there == 0 or writer_of(there[1][2]) ~= ARGV[7] then
      return 2
    end
  elseif seq >= 0 and last_writer and last_writer ~= ARGV[7] and ARGV[8] ~= '1' then
    return 2
  else
    -- A writer's first chunk names the model the job is queued for now (its record's): a job
    -- moved to another model while it waited (router.queue.move) is answered under that name.
    local model = ARGV[8] == '1' and redis.call('HGET', KEYS[4], 'model')
    local id = '0-' .. position
    local copy = {'r', KEYS[1], 'e', id, 'c', ARGV[1]}
    if model then
      redis.call('XADD', KEYS[1], id, 'c', ARGV[1], 'w', ARGV[7], 'm', model)
      copy[#copy + 1] = 'm'
      copy[#copy + 1] = model
    else
      redis.call('XADD', KEYS[1], id, 'c', ARGV[1], 'w', ARGV[7])
    end
    redis.call('EXPIRE', KEYS[1], ARGV[2])
    if ARGV[9] ~= '' then
      redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[9], '*', unpack(copy))
      redis.call('EXPIRE', KEYS[5], ARGV[10])
    end
  end
end
if ARGV[4] ~= '' then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[4])
  redis.call('XDEL', KEYS[3], ARGV[4])
  redis.call('DEL', KEYS[2])
  -- Ended: a cancel mark left from now on would be for nobody (switchboard.cancel_marks).
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('HSET', KEYS[4], 'done', 1)
  end
  return status
end
if status == 1 then
  return 1
end
return redis.call('EXISTS', KEYS[2])
