"""The model controller: what a worker loads, keeps warm, puts to sleep or evicts, from measured costs."""
