"""How much one stage's build may read, parse and produce: :class:`BuildLimits`.

Tenant files are hostile input, and every build runs inside the one shared controller
process.  These limits are enforced *while* reading, so that no input can crash the
process (unbounded recursion in a parser), hold it for minutes, or take its memory
before a check that only runs afterwards:

* YAML is checked event by event by libyaml's parser (nesting depth, node count,
  aliases, documents) **before** it is composed into nodes, so the C composer never
  recurses deeper than :attr:`BuildLimits.max_depth` and never builds more than the
  node budget; JSON is scanned for depth and size before ``json.loads``.
* Per file: bytes, documents, nodes of one document (after alias expansion).
* Per stage: bytes read or printed by kustomize, nodes parsed, objects produced.
* The kustomize subprocess: a time limit, a memory limit, and its output is
  read only up to :attr:`BuildLimits.max_stage_bytes`.

The defaults fit real repositories (a stage of thousands of objects, CRD bundles of
several MiB) while keeping a refused input to a few MiB of memory; measured figures for
hostile inputs are in ``docs/security.md``.  The controller holds one instance in its
settings (``ControllerSettings.build_limits``) and passes it down; nothing reads a
global.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from stageset.api import duration_seconds
from stageset.kube.quantity import parse_quantity

MiB = 1024 * 1024


@dataclass(frozen=True)
class BuildLimits:
    """Bounds of one stage's build; exceeding any is a :class:`~stageset.build.errors.BuildError`."""

    max_depth: int = 100
    """Nesting of collections in one YAML or JSON document (Kubernetes objects, CRD schemas
    included, stay well below 50)."""
    max_document_nodes: int = 200_000
    """Nodes of one YAML document counting every alias expanded (a "billion laughs" stops here)."""
    max_aliases: int = 10_000
    """Alias uses (``*name``) in one file."""
    max_documents_per_file: int = 10_000
    """YAML documents in one file (``---`` separated)."""
    max_file_bytes: int = 16 * MiB
    """One manifest or kustomization file."""
    max_stage_nodes: int = 2_000_000
    """YAML/JSON nodes parsed for one stage: its files and the kustomize output together."""
    max_stage_objects: int = 20_000
    """Kubernetes objects one stage renders."""
    max_stage_bytes: int = 32 * MiB
    """Manifest bytes one stage parses: plain files read plus kustomize's output; and, counted
    apart, the files given to kustomize together (checked from their sizes before any is read)."""
    kustomize_timeout: float = 60.0
    """Seconds one kustomize run may take."""
    kustomize_memory_bytes: int = 256 * MiB
    """Heap the kustomize subprocess may use (``GOMEMLIMIT``; the memory it may map is
    capped at this plus the Go runtime's own 128 MiB).  Real builds use a few tens of MiB.
    The SOPS decryption helper runs under the same time and memory limits."""
    max_encrypted_values: int = 1000
    """Encrypted values (``ENC[...]`` entries) in one stage's SOPS files, counted before anything
    is decrypted.  Decrypting costs SOPS about 0.2 ms a value (more in huge files), and every
    decrypted value is redacted from every status, event and log line."""

    @classmethod
    def with_overrides(cls, overrides: Iterable[str], base: BuildLimits | None = None) -> BuildLimits:
        """``base`` (the defaults) with ``NAME=VALUE`` overrides, as ``--build-limit`` takes them.

        Sizes (``*_bytes``) are Kubernetes quantities (``64Mi``, ``1Gi``), the timeout a duration
        (``90s``, ``2m``), everything else an integer.  Raises ValueError naming the problem.
        """
        known = {f.name for f in fields(cls)}
        changes: dict[str, Any] = {}
        for override in overrides:
            name, sep, raw = override.partition("=")
            name, raw = name.strip().replace("-", "_"), raw.strip()
            if not sep or name not in known:
                raise ValueError(f"{override!r}: expected NAME=VALUE, NAME one of {', '.join(sorted(known))}")
            try:
                if name.endswith("_bytes"):
                    # A Kubernetes quantity (64Mi, 1Gi, 100M); a fraction of a byte ("500m") is refused.
                    quantity = parse_quantity(raw)
                    if quantity != int(quantity):
                        raise ValueError(raw)
                    changes[name] = int(quantity)
                elif name == "kustomize_timeout":
                    changes[name] = duration_seconds(raw) if not raw.isdigit() else float(raw)
                else:
                    changes[name] = int(raw)
            except ValueError:
                raise ValueError(f"{override!r}: {raw!r} is not a valid value for {name}") from None
            if changes[name] <= 0:
                raise ValueError(f"{override!r}: {name} must be positive")
        return replace(base or cls(), **changes)

