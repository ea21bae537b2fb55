"""Manifests: canonical encoding, sealing, and signature verification."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.checkpoint import manifest
from sealstream.checkpoint.manifest import (
    ALG_HMAC,
    ALG_PLAIN,
    KEY_ENV,
    canonical,
    checkpoint_key,
    seal,
    sign,
    signature_ok,
)

KEY = b"k1"
OTHER = b"k2"

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=20,
)
bodies = st.dictionaries(st.text(max_size=8).filter(lambda k: k != "signature"), json_values,
                         max_size=8)
keys = st.none() | st.binary(min_size=1, max_size=32)


def reorder(value: Any, rng: st.DataObject) -> Any:
    """The same JSON value with every object's keys in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        order = rng.draw(st.permutations(range(len(items))))
        return {items[i][0]: reorder(items[i][1], rng) for i in order}
    if isinstance(value, list):
        return [reorder(v, rng) for v in value]
    return value


# ------------------------------------------------------------------ canonical


@settings(deadline=None)
@given(body=bodies, data=st.data())
def test_canonical_is_stable_under_key_order(body: dict[str, Any], data: st.DataObject) -> None:
    shuffled = reorder(body, data)
    assert canonical(shuffled) == canonical(body)
    assert sign(shuffled, None) == sign(body, None)
    assert sign(shuffled, KEY) == sign(body, KEY)


def test_canonical_form() -> None:
    body = {"b": [1, {"z": 1, "a": "é"}], "a": 1.5, "c": None}
    assert canonical(body) == '{"a":1.5,"b":[1,{"a":"é","z":1}],"c":null}'.encode()
    assert canonical(body) == canonical(dict(reversed(list(body.items()))))


def test_canonical_keeps_types_apart() -> None:
    assert canonical({"x": 1}) != canonical({"x": 1.0})
    assert canonical({"x": 1}) != canonical({"x": True})
    assert canonical({"x": 1}) != canonical({"x": "1"})


@settings(deadline=None)
@given(body=bodies)
def test_canonical_round_trips_through_json(body: dict[str, Any]) -> None:
    assert canonical(json.loads(canonical(body))) == canonical(body)


# ------------------------------------------------------------------ sign / seal / verify


def test_sign_unkeyed_is_sha256_of_canonical() -> None:
    body = {"id": 3, "pipeline": "p"}
    assert sign(body, None) == {
        "alg": ALG_PLAIN, "value": hashlib.sha256(canonical(body)).hexdigest()
    }


def test_sign_keyed_is_hmac_sha256_of_canonical() -> None:
    body = {"id": 3, "pipeline": "p"}
    expected = hmac.new(KEY, canonical(body), hashlib.sha256).hexdigest()
    assert sign(body, KEY) == {"alg": ALG_HMAC, "value": expected}


@settings(deadline=None)
@given(body=bodies, key=keys)
def test_seal_then_verify_round_trip(body: dict[str, Any], key: bytes | None) -> None:
    data = seal(body, key)
    assert data.endswith(b"\n")
    doc = json.loads(data)
    assert doc["signature"]["alg"] == (ALG_PLAIN if key is None else ALG_HMAC)
    assert signature_ok(doc, key) == (True, "OK")
    assert {k: v for k, v in doc.items() if k != "signature"} == body


def test_seal_does_not_modify_the_body() -> None:
    body = {"id": 1, "files": {"state": {"path": "x"}}}
    before = json.dumps(body, sort_keys=True)
    seal(body, KEY)
    assert json.dumps(body, sort_keys=True) == before
    assert "signature" not in body


def test_seal_is_deterministic() -> None:
    body = {"id": 1, "b": [1, 2], "a": {"y": 1, "x": 2}}
    assert seal(body, KEY) == seal(dict(reversed(list(body.items()))), KEY)
    assert seal(body, None) == seal(body, None)


@settings(deadline=None)
@given(body=bodies, k1=st.binary(min_size=1, max_size=16), k2=st.binary(min_size=1, max_size=16))
def test_hmac_differs_by_key(body: dict[str, Any], k1: bytes, k2: bytes) -> None:
    if hmac.new(k1, b"", hashlib.sha256).digest() == hmac.new(k2, b"", hashlib.sha256).digest():
        return  # equivalent keys (HMAC pads short keys with zeros)
    assert sign(body, k1)["value"] != sign(body, k2)["value"]
    doc = json.loads(seal(body, k1))
    assert signature_ok(doc, k2) == (False, "SIGNATURE_MISMATCH")


def test_keyed_and_unkeyed_values_differ() -> None:
    body = {"id": 1}
    assert sign(body, KEY)["value"] != sign(body, None)["value"]
    assert sign(body, KEY)["value"] != sign(body, OTHER)["value"]


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_any_change_to_the_body_fails_verification(key: bytes | None) -> None:
    doc = json.loads(seal({"id": 1, "watermark": {"global_ms": 10}}, key))
    doc["watermark"]["global_ms"] = 11
    assert signature_ok(doc, key) == (False, "SIGNATURE_MISMATCH")


@pytest.mark.parametrize(
    ("sealed_with", "read_with", "code"),
    [
        (None, KEY, "UNSIGNED_WITH_KEY"),
        (KEY, None, "SIGNED_WITHOUT_KEY"),
        (KEY, OTHER, "SIGNATURE_MISMATCH"),
    ],
)
def test_key_mismatches(sealed_with: bytes | None, read_with: bytes | None, code: str) -> None:
    doc = json.loads(seal({"id": 1}, sealed_with))
    assert signature_ok(doc, read_with) == (False, code)


@pytest.mark.parametrize(
    "sig",
    [None, "abc", 5, [], {}, {"alg": "sha256"}, {"value": "00"}],
    ids=["null", "string", "number", "list", "empty", "no-value", "no-alg"],
)
def test_malformed_signature(sig: Any) -> None:
    assert signature_ok({"id": 1, "signature": sig}, None) == (False, "NO_SIGNATURE")
    assert signature_ok({"id": 1}, None) == (False, "NO_SIGNATURE")


def test_unknown_algorithm() -> None:
    doc = {"id": 1, "signature": {"alg": "md5", "value": hashlib.md5(b"x").hexdigest()}}
    assert signature_ok(doc, None) == (False, "UNKNOWN_SIGNATURE_ALG")
    assert signature_ok(doc, KEY) == (False, "UNKNOWN_SIGNATURE_ALG")


def test_signature_value_of_another_type_does_not_raise() -> None:
    doc = json.loads(seal({"id": 1}, None))
    doc["signature"]["value"] = 12345
    assert signature_ok(doc, None) == (False, "SIGNATURE_MISMATCH")


# ------------------------------------------------------------------ the key from the environment


def test_checkpoint_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert checkpoint_key() is None
    monkeypatch.setenv(KEY_ENV, "")
    assert checkpoint_key() is None
    monkeypatch.setenv(KEY_ENV, "s3cret")
    assert checkpoint_key() == b"s3cret"
    assert KEY_ENV == "SEALSTREAM_CHECKPOINT_KEY"


def test_file_names() -> None:
    assert manifest.MANIFEST_NAME == "MANIFEST.json"
    assert len({manifest.MANIFEST_NAME, manifest.STATE_NAME, manifest.RECEIPTS_NAME,
                manifest.SUPPRESS_NAME}) == 4
