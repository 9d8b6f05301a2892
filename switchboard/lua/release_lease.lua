-- Delete a replica lease, only if this worker still owns it.
--
-- KEYS[1]  the replica lease (keys.replica_lease)
-- ARGV[1]  the worker's id
--
-- Returns 1 when the lease was deleted, 0 when it belongs to nobody or to another worker.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
