"""One keep-alive connection to an endpoint for the benchmark's bare HTTP clients (the
limit reader, the tiny-file seeder): plain HTTP or HTTPS by the URL's scheme. HTTPS
verifies against Python's default trust (the system store, or SSL_CERT_FILE when
set: how every contender is told about the benchmark's throwaway CA), or `cafile`.
Standard library only, so the limit reader's start-up stays a bare interpreter's.
"""

from __future__ import annotations

import http.client
import ssl
from urllib.parse import SplitResult


def connection(
    url: SplitResult, timeout: float | None = None, cafile: str | None = None
) -> http.client.HTTPConnection:
    if url.scheme != "https":
        return http.client.HTTPConnection(url.netloc, timeout=timeout)
    context = ssl.create_default_context(cafile=cafile)
    return http.client.HTTPSConnection(url.netloc, timeout=timeout, context=context)
