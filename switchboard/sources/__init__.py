"""Model sources: where a model's files are (a local folder, `s3://bucket/prefix`, `hf://org/name@rev`),
and the node cache that fetches a remote model's files once per host."""
