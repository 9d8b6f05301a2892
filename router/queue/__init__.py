"""The job queue seen from the front door: enqueue, one result reader for every job, and the run of one job."""
