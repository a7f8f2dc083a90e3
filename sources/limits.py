"""How much a source may cost: :class:`Limits`, one object for fetching and reading.

Identity: none (plain configuration).

Every limit exists because a GitRepository's URL, and so everything a Git server sends, is
tenant input.  The defaults suit GitOps repositories (manifests, a few images or docs);
the controller exposes them as flags (``--git-max-file-size`` and friends, see
``docs/sources.md``).  Exceeding one is a :class:`~sources.errors.LimitExceededError` whose
message names the limit, so the user knows what to change or ask for.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Bounds on one fetch and one read; exceeding any is a ``LimitExceededError``.

    Reads (a stage's path, or the whole source root):

    * ``max_files``: files returned by one read (after ignore rules);
    * ``max_file_bytes``: bytes of one file — also the largest object a fetch accepts
      (servers that support partial clone are asked to leave bigger blobs out; from the
      others such an object is refused from its pack header, before it is inflated);
    * ``max_total_bytes``: bytes returned by one read (after ignore rules) — with a read of
      ``./`` this is the per-source total;
    * ``max_tree_entries``: tree entries one read may visit, ignored ones included (a
      repository that reuses one subtree many times can name millions of paths in a few
      kilobytes);
    * ``max_depth``: directory nesting.

    Fetches (one transfer from a server):

    * ``max_fetch_bytes``: the unpacked size of everything one fetch brings (the commit's
      trees and blobs; deltas counted at their result size), and also its raw size;
    * ``max_fetch_objects``: objects in one pack.
    """

    max_files: int = 10_000
    max_file_bytes: int = 10 * MiB
    max_total_bytes: int = 100 * MiB
    max_tree_entries: int = 200_000
    max_depth: int = 128
    max_fetch_bytes: int = 512 * MiB
    max_fetch_objects: int = 500_000


@dataclass(frozen=True)
class ArtifactLimits:
    """Bounds on one artifact download and its archive (a Flux source's ``status.artifact``).

    * ``max_download_bytes``: bytes of the compressed file (``Content-Length`` is checked
      before anything is read, the stream counted as it arrives);
    * ``max_unpacked_bytes``: bytes of every file of the archive together, inflated (and of
      everything the decompressor produces, tar headers included, with a small allowance);
    * ``max_file_bytes``: bytes of one file (its header's size is checked before it is read);
    * ``max_files``: entries of the archive (files, directories and links);
    * ``max_depth``: directory nesting of one path; ``max_path_bytes``: length of one path;
    * ``max_paths_bytes``: length of every path together — the artifact's index, which every
      render of it holds in memory (10,000 paths of 400 bytes; real trees use a tenth of that).

    The defaults match the Git limits (``--git-max-*``): an artifact may hold what one read of a
    Git source may return.  Flags: ``--artifact-max-*`` (docs/sources.md).
    """

    max_download_bytes: int = 100 * MiB
    max_unpacked_bytes: int = 100 * MiB
    max_file_bytes: int = 10 * MiB
    max_files: int = 10_000
    max_depth: int = 128
    max_path_bytes: int = 4096
    max_paths_bytes: int = 4 * MiB
