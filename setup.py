"""The native part of datamount, built by pip from source (pyproject.toml holds
everything else): the FUSE low-level loop on libfuse3 (Debian's libfuse3-dev,
installed by `make setup`), the read path's block buffers and GIL-free
copies, and the ranged GET on OpenSSL (Debian's libssl-dev). DATAMOUNT_ASAN=1 builds them with AddressSanitizer (`make asan`)."""

import os

from setuptools import Extension, setup

CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"]
LDFLAGS: list[str] = []
if os.environ.get("DATAMOUNT_ASAN") == "1":
    CFLAGS += ["-fsanitize=address", "-fno-omit-frame-pointer", "-O1", "-g"]
    LDFLAGS += ["-fsanitize=address"]

setup(
    ext_modules=[
        Extension(
            "datamount.fs._lowlevel",
            sources=["src/datamount/fs/_lowlevel.c"],
            include_dirs=["/usr/include/fuse3"],
            libraries=["fuse3", "pthread"],
            extra_compile_args=CFLAGS,
            extra_link_args=LDFLAGS,
        ),
        Extension(
            "datamount.read._buffers",
            sources=["src/datamount/read/_buffers.c"],
            extra_compile_args=CFLAGS,
            extra_link_args=LDFLAGS,
        ),
        Extension(
            "datamount.storage._httpget",
            sources=["src/datamount/storage/_httpget.c"],
            libraries=["ssl", "crypto"],
            extra_compile_args=CFLAGS,
            extra_link_args=LDFLAGS,
        ),
    ]
)
