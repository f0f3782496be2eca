"""Ed25519 signatures for remote commands and model files (the `cryptography` library does the maths).

A command is a JSON object; its signature covers the object's canonical form without the `sig` key
(sorted keys, no spaces, UTF-8), so any change to any field, the target and the timestamp included,
breaks it. Keys travel as base64 of the raw 32 bytes: a public key fits on one config line.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edged.core.durable import fsync_dir
from edged.core.errors import CommandError, SecretError
from edged.core.secrets import check_private

PUBLIC_KEY_BYTES = 32


def canonical(envelope: dict[str, Any]) -> bytes:
    """What is signed: the object without `sig`, keys sorted, compact, UTF-8."""
    body = {k: v for k, v in envelope.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def public_key_text(key: Ed25519PublicKey) -> str:
    """A public key as one line of base64."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def load_public_key(text: str) -> Ed25519PublicKey:
    """A public key from its base64 line (ValueError if it is not one)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64") from exc
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, this is {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def generate_key(path: Path) -> str:
    """Write a new private key (PEM, mode 0600, never overwriting one) and return its public line."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise SecretError(f"{path} exists; not overwriting a key") from exc
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
        out.flush()
        os.fsync(out.fileno())  # a key the operator copied the public line of must not vanish in a cut
    fsync_dir(path.parent)
    return public_key_text(key.public_key())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The signing key from its PEM file (which must not be readable by others)."""
    check_private(path, "signing key")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise SecretError(f"cannot read the signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SecretError(f"{path} is not an Ed25519 private key")
    return key


def sign(envelope: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """The envelope with its `sig`."""
    return {**envelope, "sig": base64.b64encode(key.sign(canonical(envelope))).decode("ascii")}


def verify(envelope: dict[str, Any], keys: list[Ed25519PublicKey]) -> int:
    """The index of the trusted key that signed the envelope; CommandError `unsigned`/`bad_signature`."""
    sig = envelope.get("sig")
    if not isinstance(sig, str) or not sig:
        raise CommandError("unsigned", "the command carries no signature")
    try:
        raw = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        raise CommandError("bad_signature", "the signature is not base64") from None
    message = canonical(envelope)
    for index, key in enumerate(keys):
        try:
            key.verify(raw, message)
        except InvalidSignature:
            continue
        return index
    raise CommandError("bad_signature", "no trusted key made this signature (tampered, or signed by another key)")


def sign_file_digest(sha256: str, key: Ed25519PrivateKey) -> str:
    """A model's signature: over its sha256 (hex), base64."""
    return base64.b64encode(key.sign(f"edged-model:{sha256}".encode())).decode("ascii")


def verify_file_digest(sha256: str, signature: str, keys: list[Ed25519PublicKey]) -> bool:
    """True when a trusted key signed this sha256."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    for key in keys:
        try:
            key.verify(raw, f"edged-model:{sha256}".encode())
        except InvalidSignature:
            continue
        return True
    return False
