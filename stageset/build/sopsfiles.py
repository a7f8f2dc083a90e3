"""Which files of a stage's build are SOPS-encrypted, and in which SOPS format they are decrypted.

Pure: no process, no key, no cluster.  :func:`encrypted_files` looks only at the files the build
reads for sure (:class:`~stageset.build.render.Prepared`): the plain manifest files of a path
without a kustomization, and the files a kustomization or a generator's configuration names.
The rule, as Flux's kustomize-controller decrypts:

* a ``.yaml``/``.yml``/``.json`` file whose top level holds a ``sops`` mapping is a SOPS
  YAML/JSON file, decrypted whole (any kind: Secrets, ConfigMaps, patches ...);
* a file a ``secretGenerator`` reads through ``envs`` is a dotenv file; one it reads through
  ``files`` is YAML, JSON, dotenv (``.env``) or INI (``.ini``) by its name, and SOPS' binary
  format (a JSON object with ``data`` and ``sops``) otherwise;
* everything else is untouched (a file without SOPS metadata always is).

Refused, with a message naming the file: a SOPS file read by a ``configMapGenerator`` (its
plaintext would land in a ConfigMap, which is no place for a secret); a file beside a
kustomization that nothing names is simply not given to kustomize when it is SOPS-encrypted
(nothing reads it, so nothing needs its key).  Detection is bounded like every parse of the
build (:mod:`stageset.build.parse`): only files that contain the bytes ``sops`` are parsed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stageset.build.errors import BuildError
from stageset.build.limits import BuildLimits
from stageset.build.parse import StageBudget, load_json, load_yaml

YAML, JSON, DOTENV, INI, BINARY = "yaml", "json", "dotenv", "ini", "binary"
_DOTENV_METADATA = re.compile(rb"(?m)^sops_[A-Za-z0-9_]*=")
_INI_METADATA = re.compile(rb"(?m)^[ \t]*\[sops\][ \t]*\r?$")


def format_for_path(name: str) -> str:
    """SOPS' format for a file name (``formats.FormatForPath``): binary unless the suffix says otherwise."""
    if name.endswith((".yaml", ".yml")):
        return YAML
    if name.endswith(".json"):
        return JSON
    if name.endswith(".env"):
        return DOTENV
    if name.endswith(".ini"):
        return INI
    return BINARY


def _has_metadata(name: str, content: bytes, fmt: str, *, limits: BuildLimits) -> bool:
    """Whether ``content`` carries SOPS metadata in format ``fmt`` (what SOPS' stores look for)."""
    if b"sops" not in content:
        return False
    if fmt == DOTENV:
        return _DOTENV_METADATA.search(content) is not None
    if fmt == INI:
        return _INI_METADATA.search(content) is not None
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    budget = StageBudget(limits)  # detection is not charged to the stage: the build parses again
    documents: list[Any]
    try:
        if fmt == YAML:
            documents = [value for _, value in load_yaml(text, where=name, limits=limits, budget=budget)]
        else:
            documents = [load_json(text, where=name, limits=limits, budget=budget)]
    except BuildError:
        if fmt == BINARY:
            return False  # any file may be read by a generator; not JSON means not SOPS' binary format
        raise
    return any(isinstance(document, dict) and isinstance(document.get("sops"), dict)
               for document in documents)


def encrypted_files(files: Mapping[str, bytes], *, plain: tuple[str, ...], inputs: tuple[str, ...],
                    named: frozenset[str], generator_sources: tuple[tuple[str, str], ...],
                    limits: BuildLimits) -> tuple[dict[str, str], tuple[str, ...]]:
    """``({file: format}, withheld)``: the SOPS files the build reads, and the SOPS files beside a
    kustomization that nothing names (left out of the build's inputs)."""
    roles: dict[str, set[str]] = {}
    for source, kind in generator_sources:
        roles.setdefault(source, set()).add(kind)
    found: dict[str, str] = {}
    withheld: list[str] = []
    for name in (*plain, *inputs):
        if name in found:
            continue
        role = roles.get(name, set())
        if "secret-env" in role:
            fmt: str | None = DOTENV
        elif role:
            fmt = format_for_path(name)
        else:
            fmt = format_for_path(name) if name.endswith((".yaml", ".yml", ".json")) else None
        if fmt is None or not _has_metadata(name, files[name], fmt, limits=limits):
            continue
        if "configmap" in role:
            raise BuildError(f"{name}: SOPS-encrypted, and read by a configMapGenerator: a ConfigMap is no "
                             "place for decrypted values; read it with a secretGenerator")
        if name not in plain and name not in named:
            withheld.append(name)
            continue
        found[name] = fmt
    return found, tuple(withheld)


def describe(files: Mapping[str, str]) -> str:
    """``a.yaml`` or ``a.yaml and 2 more files``: the start of a message about SOPS files."""
    names = sorted(files)
    first = names[0] if names else "?"
    more = len(names) - 1
    return first if more <= 0 else f"{first} and {more} more file{'s' if more > 1 else ''}"
