"""``postBuild`` variables: merging ``substituteFrom`` and ``substitute``, and ``${var}`` expansion.

Pure functions; reading the ConfigMaps and Secrets is the controller's job (as the tenant).

Merge order follows Flux: ``substituteFrom`` entries in order, a later entry overriding an
earlier one, then the inline ``substitute`` map overriding them all.  A referent that does
not exist is an error unless it is ``optional``.  Variable names must match
``^[_a-zA-Z][_a-zA-Z0-9]*$``, also for the keys of ConfigMaps and Secrets (as in Flux).

Expansion (:func:`substitute`):

* ``${var}`` -> the value; unset is an error naming the variable;
* ``${var:=default}`` -> the value, or ``default`` when the variable is unset **or empty**
  (as in Flux and the shell);
* ``$${var}`` -> the literal text ``${var}`` (an escape, as in Flux); ``$${var:=x}`` likewise;
* any other ``$`` text (``$var``, ``$(cmd)``, ``${1}``, ``${var:-x}``) is left alone.

Values never appear in error messages, and nothing here logs.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from stageset.build.errors import BuildError

VARIABLE_NAME = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*$")
_EXPANSION = re.compile(r"\$(\$)?\{([_a-zA-Z][_a-zA-Z0-9]*)(?::=([^}]*))?\}")
SUBSTITUTE_KINDS = ("ConfigMap", "Secret")


class SubstituteFromNotFoundError(BuildError):
    """A ConfigMap or Secret named in ``substituteFrom`` (and not optional) does not exist."""


class VariableSource(NamedTuple):
    """One ``substituteFrom`` entry, as the controller read it.

    ``data`` is the object's ``.data`` as returned by the API (``{}`` when the object has
    none) or ``None`` when the object **does not exist** (HTTP 404).  Any other read error
    (403, timeouts) must fail the stage instead: ``optional`` tolerates only not-found.
    Secret values are base64, exactly as the API returns them.
    """

    kind: str
    name: str
    data: Mapping[str, str] | None
    optional: bool = False


def _decode_secret_value(name: str, key: str, encoded: str) -> str:
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise BuildError(f"postBuild.substituteFrom: Secret {name!r} key {key!r} is not valid base64") \
            from error
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BuildError(f"postBuild.substituteFrom: Secret {name!r} key {key!r} is not UTF-8 text") \
            from error


def _check_name(key: object, where: str) -> str:
    if not isinstance(key, str) or not VARIABLE_NAME.match(key):
        raise BuildError(f"{where}: {key!r} is not a valid variable name "
                         f"(names must match {VARIABLE_NAME.pattern})")
    return key


def merge_variables(substitute: Mapping[str, str] | None,
                    sources: Iterable[VariableSource | tuple[str, str, Mapping[str, str] | None, bool]] = (),
                    ) -> dict[str, str]:
    """The variables of a stage: ``sources`` (``substituteFrom``) in order, then ``substitute`` wins.

    Raises :class:`SubstituteFromNotFoundError` for a missing referent that is not optional,
    :class:`BuildError` for invalid names, undecodable Secret values or non-string data.
    """
    merged: dict[str, str] = {}
    for entry in sources:
        source = VariableSource(*entry)
        if source.kind not in SUBSTITUTE_KINDS:
            raise BuildError(f"postBuild.substituteFrom: kind {source.kind!r} is not one of "
                             f"{', '.join(SUBSTITUTE_KINDS)}")
        if source.data is None:
            if source.optional:
                continue
            raise SubstituteFromNotFoundError(
                f"postBuild.substituteFrom: {source.kind} {source.name!r} not found "
                "(mark it optional: true to build without it)")
        where = f"postBuild.substituteFrom: {source.kind} {source.name!r} key"
        for key, value in source.data.items():
            name = _check_name(key, where)
            if not isinstance(value, str):
                raise BuildError(f"{where} {key!r} does not hold a string")
            if source.kind == "Secret":
                value = _decode_secret_value(source.name, name, value)
            merged[name] = value
    for key, value in (substitute or {}).items():
        name = _check_name(key, "postBuild.substitute")
        if not isinstance(value, str):
            raise BuildError(f"postBuild.substitute: {key!r} does not hold a string")
        merged[name] = value
    return merged


def has_expansion(text: str) -> bool:
    """Whether ``text`` holds anything :func:`substitute` would change."""
    return "${" in text and _EXPANSION.search(text) is not None


def substituted_forms(values: Iterable[str], variables: Mapping[str, str] | None) -> frozenset[str]:
    """What substitution makes of each of ``values`` that it changes: a decrypted value holding
    ``${var}`` reaches the objects in that form, and must be masked as it reads there.  A value
    that cannot be substituted (an unset variable) is left out: its build fails anyway.
    ``variables`` ``None``: the stage substitutes nothing (no ``postBuild``)."""
    if variables is None:
        return frozenset()
    forms: set[str] = set()
    for value in values:
        if not has_expansion(value):
            continue
        try:
            forms.add(substitute(value, variables, origin="a decrypted value"))
        except BuildError:
            continue
    return frozenset(forms - set(values))


def substitute(text: str, variables: Mapping[str, str], *, origin: str) -> str:
    """Expand ``${var}`` / ``${var:=default}`` and unescape ``$${...}`` in ``text``.

    An unset variable without default is a :class:`BuildError` naming it and ``origin``.
    """

    def replace(match: re.Match[str]) -> str:
        escaped, name, default = match.group(1), match.group(2), match.group(3)
        if escaped:
            return match.group(0)[1:]
        value = variables.get(name)
        if default is not None and not value:
            return default
        if value is None:
            raise BuildError(f"{origin}: variable ${{{name}}} is not set and has no default")
        return value

    return _EXPANSION.sub(replace, text)
