-- Whether a job's client has left while the job waited in line: its cancel mark is set. A script
-- only so that the checks of a burst of jobs share a round trip (batched.ScriptBatch).
--
-- KEYS[1]  the job's cancel mark (keys.cancel_mark)
--
-- Returns 1 when the mark is set, else 0.
return redis.call('EXISTS', KEYS[1])
