"""Block caches behind one small protocol: a RAM tier (memory.py), a disk tier
(disk.py) and the two-tier cache written as one more cache (tiered.py); and
the fetcher's hold of unread and recently read blocks (held.py)."""
