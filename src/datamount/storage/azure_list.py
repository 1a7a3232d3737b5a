"""Blob service answers read into ObjectInfo and ListPage: a List Blobs page
(XML), the headers of Get Blob Properties (HEAD) and of Put Blob.

Why not the SDK's deserialiser: nearly all its cost is per-field model
building; ElementTree's C parser plus one pass over the elements does the
same work in a fraction of that (docs/design/storage.md, "Listings").

The fields are read exactly as azure-storage-blob reads them, so both paths
give equal ObjectInfos: names marked Encoded="true" are percent-decoded,
etags are quoted as the header etags are, Content-MD5 is base64, dates are
RFC 1123 and become POSIX timestamps, and an `hdi_isfolder: true` metadata
entry (an ADLS directory, or a folder marker some tools write) sets is_dir.

Threads: pure functions.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import email.utils
import functools
import io
from collections.abc import Mapping
from urllib.parse import unquote
from xml.etree import ElementTree

from datamount.errors import StorageError
from datamount.storage.base import ListPage, ObjectInfo

PAGE_SIZE = 5000  # the List Blobs maximum: fewest round trips per listing
# A directory listing (delimiter '/') is what `ls` and os.scandir wait on: its
# first page is smaller so the first entries arrive early.
# Why 1,000: docs/design/storage.md ("Listings").
FIRST_DIR_PAGE_SIZE = 1000
FOLDER_KEY = "hdi_isfolder"
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


def quoted_etag(value: str | None) -> str:
    """Etags as the blob service sends them in headers: quoted. (List Blobs
    returns them bare; the same version must compare equal everywhere.)"""
    value = value or ""
    if value.startswith('"') or value.startswith("W/"):
        return value
    return f'"{value}"'


@functools.lru_cache(maxsize=4096)  # a listing repeats seconds: blobs come in batches
def http_time(text: str | None) -> float | None:
    """An RFC 1123 date ('Sun, 01 Mar 2026 10:00:00 GMT') as a POSIX
    timestamp; None when absent or unreadable. Not email.utils (5,000 dates
    per listing page): docs/design/storage.md ("Listings")."""
    if not text:
        return None
    try:
        _, day, month, year, clock, zone = text.split()
        hour, minute, second = clock.split(":")
        if zone == "GMT":
            when = dt.datetime(
                int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second), 0, dt.UTC
            )
            return when.timestamp()
    except (ValueError, KeyError):
        pass
    try:  # other forms the RFCs allow: the slow, general parser
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def b64_md5(value: str | None) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(value)
    except (binascii.Error, ValueError):
        return None


def list_params(
    prefix: str, delimiter: str | None, marker: str | None, page_size: int = PAGE_SIZE
) -> list[tuple[str, str]]:
    """The query of one List Blobs request (unencoded; empty ones left out).
    Metadata is always asked for: it is how folder markers are told apart."""
    params = [("restype", "container"), ("comp", "list")]
    if prefix:
        params.append(("prefix", prefix))
    if delimiter:
        params.append(("delimiter", delimiter))
    if marker:
        params.append(("marker", marker))
    params += [("maxresults", str(page_size)), ("include", "metadata")]
    return params


def _name(elem: ElementTree.Element | None) -> str:
    if elem is None:
        return ""
    text = elem.text or ""
    # Names with characters XML cannot carry come percent-encoded, and say so.
    return unquote(text) if elem.get("Encoded") == "true" else text


def _blob(elem: ElementTree.Element) -> ObjectInfo:
    name = size = etag = modified = md5 = None
    folder = False
    for child in elem:
        tag = child.tag
        if tag == "Name":
            name = _name(child)
        elif tag == "Properties":
            for prop in child:
                ptag = prop.tag
                if ptag == "Content-Length":
                    size = prop.text
                elif ptag == "Etag":
                    etag = prop.text
                elif ptag == "Last-Modified":
                    modified = prop.text
                elif ptag == "Content-MD5":
                    md5 = prop.text
        elif tag == "Metadata":
            folder = child.findtext(FOLDER_KEY) == "true"
    return ObjectInfo(
        key=name or "",
        size=int(size or 0),
        etag=quoted_etag(etag),
        last_modified=http_time(modified),
        content_md5=b64_md5(md5),
        is_dir=folder,
    )


def parse_list(body: bytes, *, target: str = "") -> tuple[ListPage, str | None]:
    """One List Blobs answer: its page (blobs and, with a delimiter, the
    virtual directories, in the service's order) and the next marker.

    Each <Blob> is read when its end tag is parsed, then cleared: far less
    memory than the whole tree (fromstring), as fast, and less for the
    garbage collector to walk (docs/design/storage.md, "Listings"). Entries
    are recognised by depth, not by tag alone: a metadata entry may be
    called 'Blob' or 'NextMarker'.
    """
    page = ListPage()
    marker: str | None = None
    depth = 0
    try:
        for event, elem in ElementTree.iterparse(io.BytesIO(body), events=("start", "end")):
            if event == "start":
                depth += 1
                continue
            depth -= 1
            if depth == 2:  # EnumerationResults / Blobs / this
                if elem.tag == "Blob":
                    page.objects.append(_blob(elem))
                elif elem.tag == "BlobPrefix":
                    page.prefixes.append(_name(elem.find("Name")))
                elem.clear()
            elif depth == 1 and elem.tag == "NextMarker":
                marker = elem.text or None
    except ElementTree.ParseError:
        # Read to its length yet not XML: a proxy's page or a damaged body.
        # Repeating the request is the only remedy, so it is transient.
        raise StorageError(
            f"list {target!r} failed: the answer is not a listing", transient=True
        ) from None
    return page, marker


def info_from_headers(key: str, headers: Mapping[str, str]) -> ObjectInfo:
    """The ObjectInfo of a Get Blob Properties answer (lower-case header names)."""
    return ObjectInfo(
        key=key,
        size=int(headers.get("content-length") or 0),
        etag=quoted_etag(headers.get("etag")),
        last_modified=http_time(headers.get("last-modified")),
        content_md5=b64_md5(headers.get("content-md5")),
        is_dir=headers.get(f"x-ms-meta-{FOLDER_KEY}") == "true",
    )
