"""datamount: a per-node data runtime for ML training jobs.

Resolves job inputs/outputs (Azure ML spec forms) and makes them appear as
local paths: parallel download, FUSE mount over a block cache, upload.
"""

__version__ = "0.1.0"
