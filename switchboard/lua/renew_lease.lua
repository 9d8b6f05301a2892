-- Renew the replica leases this worker still owns; report (by position) those it lost.
--
-- KEYS     the replica leases (keys.replica_lease), one per held replica
-- ARGV[1]  the worker's id (a lease's value while this worker owns it)
-- ARGV[2]  the lease's new time to live (milliseconds)
--
-- Returns the 1-based positions in KEYS of the leases no longer this worker's.
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
  else
    table.insert(lost, i)
  end
end
return lost
