"""The read path under a mount: block fetcher, readers, cache tiers, prefetch."""
