"""The filesystem: `namespace` (names and attributes over a store), `ops`
(filesystem operations in plain Python, raising OSError), the rw_mount side
(`writable`, `staged`, `folders`, `kept`), and the FUSE layers in front of
them: `lowlevel` over the native `_lowlevel` (ro_mount) and `fuse_adapter`
(rw_mount, the only mfusepy import), sharing `funnel`. Load a FUSE layer only
where a mount is made: importing one loads libfuse."""
