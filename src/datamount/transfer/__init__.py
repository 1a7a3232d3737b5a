"""Transfers between a store and local disk: the parallel Downloader and
Uploader (DESIGN.md §4), their listing, resume manifest and progress.
"""
