"""The filesystem: `namespace` (names and attributes over a store), `ops`
(filesystem operations in plain Python, raising OSError), the rw_mount side
(`writable`, `staged`, `folders`, `kept`), and the FUSE layer in front of
them: `lowlevel` over the native `_lowlevel` (libfuse3's low-level loop in C,
every mode), with `funnel`, its errno funnel. Load the FUSE layer only where
a mount is made: importing it loads libfuse."""
