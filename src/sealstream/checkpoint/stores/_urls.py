"""Store URLs: telling a URL from a directory path, their schemes, and showing them
without a password (:func:`redact`)."""

from __future__ import annotations

import re
from pathlib import Path

from sealstream.errors import SpecError

SQLITE = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_url(text: str) -> bool:
    """Whether ``text`` is a store URL rather than a directory path."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) is not None


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_postgres(url: str) -> bool:
    return scheme(url) in POSTGRES_SCHEMES


def is_s3(url: str) -> bool:
    return scheme(url) == "s3"


def redact(url: str) -> str:
    """``url`` with its password hidden: ``user:PASSWORD@`` and ``password=...``."""
    url = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/@]*@", r"\1:***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


def sqlite_path(url: str, base_dir: Path = Path(".")) -> Path:
    """The database file of a ``sqlite:///`` URL (relative paths from ``base_dir``);
    SpecError for any other URL."""
    if not url.startswith(SQLITE):
        raise SpecError(
            f"checkpoint url {redact(url)!r}: expected sqlite:///FILE, "
            "postgresql://HOST/DB, s3://BUCKET/PREFIX (or a directory path)"
        )
    rest = url[len(SQLITE):].split("?", 1)[0]
    if not rest or rest.endswith("/") or "\x00" in rest:
        raise SpecError(f"checkpoint url {redact(url)!r}: names no database file")
    p = Path(rest)
    return p if p.is_absolute() else base_dir / p


def check_url(url: str, base_dir: Path = Path(".")) -> None:
    """SpecError naming what is wrong with a store URL (nothing is connected)."""
    if is_s3(url):
        from sealstream._objects import ObjectStoreError
        from sealstream._objects.s3 import parse_url

        try:
            parse_url(url)
        except ObjectStoreError as exc:
            raise SpecError(f"checkpoint url {exc}") from None
        return
    if is_postgres(url):
        rest = url.split("://", 1)[1]
        if not rest.strip("/") or "\x00" in url:
            raise SpecError(f"checkpoint url {redact(url)!r}: names no server or database")
        return
    sqlite_path(url, base_dir)
