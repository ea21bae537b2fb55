"""Which client :class:`~sealstream._objects.s3.S3Objects` sends its requests with, and
the obstore side of it (see :mod:`sealstream._objects.s3`).

obstore (the Python bindings of Rust's ``object_store``) is used when it is installed
and botocore would find the credentials in the environment anyway
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, maybe ``AWS_SESSION_TOKEN``), with
nothing in the shared config file or the environment that botocore would honour and
obstore would not; otherwise botocore, as before. ``SEALSTREAM_S3_CLIENT`` picks one
(``auto``, the default; ``botocore``; ``obstore``, an error when it cannot be used).

obstore's ``S3Store`` reads ``AWS_*`` variables itself (``object_store``'s
``from_env``) but neither ``~/.aws/config`` nor ``~/.aws/credentials``, profiles,
nor instance or container roles through botocore's chain: every setting that matters
is therefore passed explicitly, and anything else sends the store to botocore.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["CHOICES", "choose", "make_store", "parse_fault"]

#: the values of SEALSTREAM_S3_CLIENT
CHOICES = ("auto", "botocore", "obstore")

#: variables botocore honours that obstore does not (or reads differently)
_BOTOCORE_ONLY_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_USE_FIPS_ENDPOINT",
                      "AWS_USE_DUALSTACK_ENDPOINT", "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT",
                      "AWS_S3_DISABLE_MULTIREGION_ACCESS_POINTS")
#: keys of the shared config file's profile that change nothing a request does
_HARMLESS_KEYS = {"output", "cli_pager", "cli_timestamp_format", "cli_follow_urlparam",
                  "cli_binary_format", "cli_auto_prompt", "aws_access_key_id",
                  "aws_secret_access_key", "aws_session_token"}


def wanted() -> str:
    """``SEALSTREAM_S3_CLIENT`` (``auto`` when unset or empty); ValueError otherwise."""
    value = (os.environ.get("SEALSTREAM_S3_CLIENT") or "auto").strip().lower()
    if value not in CHOICES:
        raise ValueError(f"SEALSTREAM_S3_CLIENT={value!r}: expected one of "
                         + ", ".join(CHOICES))
    return value


def region() -> str | None:
    """The region botocore takes from the environment (``AWS_DEFAULT_REGION``), else
    ``AWS_REGION``."""
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or None


def _config_file() -> Path:
    return Path(os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config").expanduser()


def _profile_settings() -> set[str] | None:
    """The keys of the active profile in the shared config file (botocore's
    ``AWS_CONFIG_FILE``, else ``~/.aws/config``); None when there is no such file, the
    keys of every section when it cannot be read."""
    path = _config_file()
    if not path.exists():
        return None
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return {"unreadable"}
    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    keys: set[str] = set()
    for name in (profile, f"profile {profile}"):
        if parser.has_section(name):
            keys |= set(parser.options(name))
    return keys


def obstore_missing(endpoint_url: str | None) -> str | None:
    """Why obstore cannot send this store's requests as botocore would (None: it can)."""
    env = os.environ
    if importlib.util.find_spec("obstore") is None:
        return "obstore is not installed"
    if not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
        return ("the credentials are not in the environment (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY); botocore's chain finds them")
    set_env = [n for n in _BOTOCORE_ONLY_ENV if env.get(n)]
    if not endpoint_url and env.get("AWS_ENDPOINT"):
        set_env.append("AWS_ENDPOINT")  # obstore's own name of an endpoint
    if set_env:
        return f"{', '.join(set_env)} is set (botocore honours it)"
    if env.get("AWS_CA_BUNDLE") and not os.path.isfile(env["AWS_CA_BUNDLE"]):
        return "AWS_CA_BUNDLE is not a readable file"
    keys = _profile_settings()
    if keys is not None:
        extra = sorted(keys - _HARMLESS_KEYS - {"region"})
        if extra:
            return f"the shared config file sets {', '.join(extra)} (botocore honours it)"
        if "region" in keys and region() is None:
            return "the region is in the shared config file, not in the environment"
    return None


def choose(endpoint_url: str | None) -> str:
    """``"obstore"`` or ``"botocore"`` for a store (see the module); ValueError when
    SEALSTREAM_S3_CLIENT is not a choice or asks for obstore where it cannot be used."""
    want = wanted()
    if want == "botocore":
        return "botocore"
    missing = obstore_missing(endpoint_url)
    if missing is None:
        return "obstore"
    if want == "obstore":
        raise ValueError(f"SEALSTREAM_S3_CLIENT=obstore cannot be used: {missing}")
    return "botocore"


def make_store(bucket: str, endpoint_url: str | None, pool: int, retry_s: float,
               bulk_delete: bool = False) -> Any:
    """An obstore ``S3Store`` of ``bucket`` with every setting given (see the module):
    the credentials and the region of the environment, path-style addressing (and
    plain http allowed) for an endpoint, botocore's timeouts (connect 5 s, 30 s without
    a byte), and no retries of its own: :class:`S3Objects` retries server faults for
    its retry budget, as on botocore. obstore deletes even one key with
    ``DeleteObjects``; unless ``bulk_delete``, the store sends ``DeleteObject`` (one
    ``DELETE`` per key) instead, as botocore's ``delete_object``."""
    from obstore.store import S3Store

    env = os.environ
    config: dict[str, Any] = {
        "access_key_id": env["AWS_ACCESS_KEY_ID"],
        "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region": region() or "us-east-1",  # botocore's default for S3 too
        "skip_signature": False,
        "conditional_put": "etag",
        "unsigned_payload": False,
        "disable_tagging": True,
        "disable_bulk_delete": not bulk_delete,
    }
    if env.get("AWS_SESSION_TOKEN"):
        config["session_token"] = env["AWS_SESSION_TOKEN"]
    options: dict[str, Any] = {"connect_timeout": "5s", "read_timeout": "30s",
                               "timeout": "3600s", "pool_max_idle_per_host": str(pool)}
    if env.get("AWS_CA_BUNDLE"):  # botocore's roots; obstore adds them to the system's
        options["root_certificate"] = Path(env["AWS_CA_BUNDLE"]).read_bytes()
    if endpoint_url:
        config["endpoint"] = endpoint_url
        config["virtual_hosted_style_request"] = False
        options["allow_http"] = endpoint_url.lower().startswith("http://")
    else:  # botocore's "auto": virtual-hosted, unless the name has a dot (TLS)
        config["virtual_hosted_style_request"] = "." not in bucket
    retry = {"max_retries": 0, "retry_timeout": timedelta(seconds=max(1.0, retry_s))}
    return S3Store(bucket, config=config, client_options=options,  # type: ignore[arg-type]
                   retry_config=retry)  # type: ignore[arg-type]


def parse_fault(exc: BaseException) -> tuple[str, int, str, str]:
    """``(code, status, message, kind)`` of an obstore error: the S3 error code and
    message of the answer's body, its HTTP status (0: no answer) and the kind of
    failure object_store names (``Connect``, ``Timeout``, ``Body``...). Read from the
    error's text, which is never shown (it holds the request's URL and more)."""
    text = str(exc)
    m = re.search(r"status code: (\d{3})", text)
    status = int(m.group(1)) if m else 0
    m = re.search(r"<Code>([^<]{1,80})</Code>", text)
    code = m.group(1) if m else ""
    m = re.search(r"<Message>([^<\n]{0,200})</Message>", text)
    message = m.group(1) if m else ""
    m = re.search(r"\bkind: (\w{1,40})", text)
    kind = m.group(1) if m else type(exc).__name__
    return code, status, message, kind


def missing_header(exc: BaseException) -> str | None:
    """The header object_store found missing from an answer (``ETag``,
    ``Content-Length``...), None when the error is something else."""
    text = str(exc)
    m = re.search(r"\b([A-Za-z-]{2,40}) [Hh]eader missing", text) \
        or re.search(r"[Mm]issing ([A-Za-z-]{2,40}) [Hh]eader", text)
    return m.group(1) if m else None
