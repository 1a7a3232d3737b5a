"""The write path under an rw_mount: the staging journal and the write-back uploader."""
