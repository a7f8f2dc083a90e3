"""Artifacts at the documented limits, as an attacker within them would publish them (memory tests, bench).

:func:`at_the_limits` is a gzip-compressed tarball of :data:`ZERO_FILES` files of
:data:`ZERO_FILE_BYTES` zero bytes each (just under ``--artifact-max-file-size``, together just under
``--artifact-max-unpacked-size``, about 100 KiB compressed) beside a small kustomization:

* ``app/`` — a kustomization and one ConfigMap: a stage at ``app`` becomes Ready (its build loads
  two small files; the zeros are not its business);
* ``zeros/z0.yaml`` … — :data:`READ_ZEROS` files of zeros a stage at ``zeros`` reads as plain
  manifests (together under the build's 32 MiB per stage, so each is read and parsed: the worst a
  render of this tree may hold), and fails on;
* ``blobs/`` — the rest, read by nothing.

Built a MiB at a time, so the builder itself stays small.
"""

from __future__ import annotations

import functools
import gzip
import io
import tarfile

MiB = 1024 * 1024
ZERO_FILES = 10
ZERO_FILE_BYTES = int(9.9 * MiB)
READ_ZEROS = 3


def at_the_limits(*, name: str) -> bytes:
    """The tarball (see the module); ``name`` goes into the ConfigMap, so each caller's digest differs.

    Two gzip members (a gzip file may hold several; readers inflate them as one stream, as
    :mod:`gzip` and Go's ``compress/gzip`` do): the small files, then the zeros and the end of the
    archive, compressed once per process (3 s of zlib) and shared."""
    small = {
        "app/kustomization.yaml": b"resources: [cm.yaml]\n",
        "app/cm.yaml": (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"
                        f"data:\n  from: artifact\n").encode(),
    }
    head = io.BytesIO()
    for path, data in small.items():
        info = tarfile.TarInfo(path)
        info.size, info.mode = len(data), 0o644
        head.write(info.tobuf(format=tarfile.PAX_FORMAT) + data + _padding(len(data)))
    return gzip.compress(head.getvalue(), mtime=0) + _zeros_member()


def _padding(size: int) -> bytes:
    return bytes(-size % tarfile.BLOCKSIZE)


@functools.cache
def _zeros_member() -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as compressed:
        chunk = bytes(MiB)
        for index in range(ZERO_FILES):
            path = f"zeros/z{index}.yaml" if index < READ_ZEROS else f"blobs/b{index}.bin"
            info = tarfile.TarInfo(path)
            info.size, info.mode = ZERO_FILE_BYTES, 0o644
            compressed.write(info.tobuf(format=tarfile.PAX_FORMAT))
            left = ZERO_FILE_BYTES
            while left > 0:
                compressed.write(chunk[:min(left, MiB)])
                left -= MiB
            compressed.write(_padding(ZERO_FILE_BYTES))
        compressed.write(bytes(tarfile.BLOCKSIZE * 2))
    return buffer.getvalue()
