"""SOPS decryption of a stage's files, in memory, by the isolated ``stageset-sops`` helper.

Why a Go helper (measured; docs/secrets.md has the numbers): SOPS' own packages
(``github.com/getsops/sops/v3``: its YAML/JSON/dotenv/INI/binary stores, its AES-GCM cipher,
key groups and MAC) decrypt exactly what the ``sops`` CLI and Flux's kustomize-controller
decrypt, with no re-implementation of the format in Python.  They are not linked into the
``stageset-kustomize`` builder: SOPS' root package imports every cloud KMS SDK, which makes a
binary four times larger that starts six times slower (+12 ms and +28 MiB per run), and every
build would pay for it.  The helper runs only for a stage whose build reads SOPS files.

* **The helper** (``hack/sops/cmd/stageset-sops``, built from the Go module proxy like the
  builder, cached as ``<cache>/tools/stageset-sops-<version>-<digest>/stageset-sops``; a
  platform wheel ships it in the package, a container image installs it on ``PATH``;
  ``$STAGESET_SOPS_HELPER`` overrides; found in that order as the builder is) gets the key
  entries and the files as a tar stream on stdin and returns the decrypted files and the
  decrypted values on stdout.  It runs like the builder (:func:`~stageset.build.kustomize.run_isolated`):
  no network, an empty environment, no filesystem, the build's time and memory limits.
  Nothing is written to disk; the plaintext lives only in this process's memory and the
  helper's.
* **Keys** (:class:`DecryptionKeys`): the entries of the key Secret whose names end in
  ``.agekey`` (age identities) or ``.asc`` (armored OpenPGP private keys), as Flux names them.
  Their ``repr`` shows entry names only; :attr:`DecryptionKeys.digest` (SHA-256 over the
  entries) is for cache keys, never shown.
* **Errors** (:class:`DecryptionError`) name the file and a fixed reason (``no key matches the
  file's recipients``, ``MAC mismatch``, ...): never a key, a value, or a digest of a value.
  The helper's stderr is never shown (only its exit status).

Identity: none here.  The caller reads the key Secret as the StageSet's ServiceAccount
(:mod:`stageset.controller.render.decryption`, the CLI's ``build``/``diff``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stageset.build.errors import BuildError
from stageset.build.kustomize import (
    GoBuild,
    KustomizeNotFoundError,
    cache_root,
    ensure_go_binary,
    locate_binary,
    run_isolated,
    sources_digest,
    tar_stream,
)
from stageset.build.limits import BuildLimits

SOPS_VERSION = "v3.13.3"
"""Pinned ``github.com/getsops/sops/v3``: the helper's decryption and the tests' ``sops`` CLI."""
SOPS_MODULE = "github.com/getsops/sops/v3"
HELPER_NAME = "stageset-sops"
HELPER_PACKAGE = "./cmd/stageset-sops"
ENV_HELPER = "STAGESET_SOPS_HELPER"
WRAPPER = Path(__file__).resolve().parents[2] / "hack" / "sops"
"""The checked-in wrapper module (the helper and the tests' sops CLI); only in a checkout."""
AGE_SUFFIX, PGP_SUFFIX = ".agekey", ".asc"
_ENCRYPTED = b"ENC[AES256_GCM,"

HELPER_BUILD = GoBuild(wrapper=WRAPPER, version=SOPS_VERSION, ldflags="", nosumdb="github.com/getsops",
                 env_override=ENV_HELPER)


class DecryptionError(BuildError):
    """A SOPS file of the stage cannot be decrypted; the message names it and says why, secret-free."""


class DecryptorNotFoundError(KustomizeNotFoundError):
    """No usable ``stageset-sops`` helper: a deployment problem, not a problem of the stage's files."""


# --------------------------------------------------------------------------- the helper binary


@functools.cache
def _digest() -> str:
    return sources_digest(WRAPPER)


def cached_helper() -> Path:
    """Where :func:`ensure_helper` puts the helper it builds."""
    return cache_root() / "tools" / f"{HELPER_NAME}-{SOPS_VERSION}-{_digest()}" / HELPER_NAME


def locate_helper() -> Path:
    """The helper: ``$STAGESET_SOPS_HELPER``, the package's own, the cached build, or PATH."""
    return locate_binary(env=ENV_HELPER, cached=cached_helper(), name=HELPER_NAME,
                         error=DecryptorNotFoundError)


def ensure_helper(*, log: bool = True) -> Path:
    """The helper, built once into the cache if needed (honours ``$STAGESET_SOPS_HELPER``)."""
    if os.environ.get(ENV_HELPER):
        return locate_helper()
    return ensure_go_binary(cached_helper(), package=HELPER_PACKAGE, name=HELPER_NAME, how=HELPER_BUILD,
                            log=log)


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class DecryptionKeys:
    """The age and OpenPGP entries of a key Secret (entry name -> content)."""

    secret: str
    """``namespace/name`` of the Secret, for messages."""
    entries: Mapping[str, bytes] = field(repr=False)

    @classmethod
    def from_secret_data(cls, secret: str, data: Mapping[str, str]) -> DecryptionKeys:
        """From a Secret's ``data`` (base64); entries of other names are ignored."""
        entries: dict[str, bytes] = {}
        for name, encoded in data.items():
            if name.endswith((AGE_SUFFIX, PGP_SUFFIX)):
                try:
                    entries[name] = base64.b64decode(encoded, validate=True)
                except ValueError:
                    raise BuildError(f"key Secret {secret}: entry {name!r} is not valid base64") from None
        return cls(secret=secret, entries=entries)

    @classmethod
    def from_age_file(cls, path: Path) -> DecryptionKeys:
        """A local age identity file (``--sops-age-key-file``)."""
        return cls(secret=str(path), entries={f"{path.name}{AGE_SUFFIX}": path.read_bytes()})

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 over every entry: what a cache key needs to tell a rotated key from the last one."""
        material = hashlib.sha256()
        for name in sorted(self.entries):
            material.update(name.encode() + b"\0" + hashlib.sha256(self.entries[name]).digest())
        return material.hexdigest()

    def describe(self) -> str:
        age = sum(name.endswith(AGE_SUFFIX) for name in self.entries)
        pgp = sum(name.endswith(PGP_SUFFIX) for name in self.entries)
        return f"{age} age and {pgp} OpenPGP entr{'y' if age + pgp == 1 else 'ies'}"


# --------------------------------------------------------------------------- decrypting


@dataclass(frozen=True)
class Decrypted:
    files: dict[str, bytes] = field(repr=False)
    """Each file decrypted (same name, same format, no SOPS metadata)."""
    values: frozenset[str] = field(repr=False)
    """Every value that was encrypted, as text: to be redacted wherever it could show."""


def _untar(data: bytes) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                handle = archive.extractfile(member) if member.isfile() else None
                if handle is not None:
                    found[member.name] = handle.read()
    except tarfile.TarError:
        raise BuildError(f"{HELPER_NAME} returned output that is not a tar stream") from None
    return found


def with_decoded(values: frozenset[str]) -> frozenset[str]:
    """The values, and the text of those that are base64 of UTF-8 text (a Secret's ``data``
    entries are encrypted as base64: what an echo shows may be either form)."""
    decoded: set[str] = set()
    for value in values:
        try:
            text = base64.b64decode(value, validate=True).decode("utf-8")
        except ValueError:
            continue
        if text.strip():
            decoded.add(text)
    return values | decoded


def decrypt(files: Mapping[str, bytes], formats: Mapping[str, str], *, keys: DecryptionKeys,
            limits: BuildLimits, helper: Path | None = None) -> Decrypted:
    """Decrypt ``files`` (name -> content; ``formats`` name -> SOPS format) with ``keys``.

    Raises :class:`DecryptionError` naming the first file that fails and why, :class:`BuildError`
    for limits, :class:`DecryptorNotFoundError` when no helper runs.
    """
    if not keys.entries:
        raise DecryptionError(f"{sorted(formats)[0]}: SOPS-encrypted, and key Secret {keys.secret} holds no "
                              f"entry ending in {AGE_SUFFIX} or {PGP_SUFFIX}")
    count = sum(files[name].count(_ENCRYPTED) for name in formats)
    if count > limits.max_encrypted_values:
        raise DecryptionError(f"{sorted(formats)[0]}: more than {limits.max_encrypted_values} encrypted "
                              f"values in the stage's SOPS files ({count}; the limit max_encrypted_values)")
    executable = helper or locate_helper()
    request = {"files": dict(formats), "maxValues": limits.max_encrypted_values}
    entries = {"request.json": json.dumps(request).encode()}
    entries.update({f"keys/{name}": content for name, content in keys.entries.items()})
    entries.update({f"files/{name}": files[name] for name in formats})
    result = run_isolated([str(executable)], tar_stream(entries), limits=limits, what="SOPS decryption",
                          program=HELPER_NAME)
    if result.returncode not in (0, 1):
        # The helper's stderr is never shown: only SOPS' reasons, which the helper words itself.
        raise BuildError(f"SOPS decryption failed ({HELPER_NAME} exited with status {result.returncode})")
    out = _untar(result.stdout)
    if result.returncode == 1:
        failure = json.loads(out.get("error.json") or b"{}")
        where = f"{failure.get('file')}: " if failure.get("file") else f"key Secret {keys.secret}: "
        raise DecryptionError(f"{where}{failure.get('reason') or 'cannot be decrypted'}")
    missing = [name for name in formats if f"files/{name}" not in out]
    if missing or "values.json" not in out:
        raise BuildError(f"{HELPER_NAME} returned an incomplete result")
    values = json.loads(out["values.json"])
    return Decrypted(files={name: out[f"files/{name}"] for name in formats},
                     values=with_decoded(frozenset(str(v) for v in values if v)))
