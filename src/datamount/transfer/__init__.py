"""Transfers between a store and local disk: the parallel Downloader and
Uploader (docs/design/download.md), their listing, resume manifest and progress.
"""
