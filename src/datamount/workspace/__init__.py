"""The local workspace: datastores, assets, registries, run history,
`${VAR}` expansion, and the locked files they are kept in."""
