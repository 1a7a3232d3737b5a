"""The read-only filesystem: `namespace` (names and attributes over a store),
`ops` (filesystem operations in plain Python, raising OSError) and
`fuse_adapter` (the thin mfusepy layer, the only FUSE import; load it only
where a mount is made, since importing it loads libfuse)."""
