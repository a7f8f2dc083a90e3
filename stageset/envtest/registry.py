"""A real OCI registry on loopback: CNCF distribution's ``registry``, built from the Go module proxy.

What ``make release`` produces is pushed to it exactly as the release workflow pushes it to the
real registries (:mod:`stageset.envtest.publish`), and the test node installs the chart from it
with one ``helm install oci://...`` while its containerd pulls the image (``tests/node``).

Built like every Go tool of the tests (:class:`~stageset.envtest.gotool.GoTool`, wrapper
``hack/registry``, cached in ``<cache>/tools/registry-<version>/registry``, in a background lane of
``hack/test.sh``); ``STAGESET_REGISTRY`` naming an executable wins; ``--update`` regenerates the
wrapper after a version bump.

:class:`Registry` runs one on a free loopback port, plain HTTP, filesystem storage in a directory
of its own, deletes allowed, no authentication (nothing but this machine reaches loopback).

Identity: none.  The registry is anonymous; nothing here touches a cluster.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stageset.envtest.gotool import GoTool
from stageset.envtest.server import _die_with_parent, free_port

REGISTRY_VERSION = "v3.1.2"
_MODULE = "github.com/distribution/distribution/v3"
REGISTRY = GoTool(name="registry", version=REGISTRY_VERSION, module=_MODULE,
                  package=f"{_MODULE}/cmd/registry", binary="registry", env_override="STAGESET_REGISTRY",
                  ldflags=f"-X {_MODULE}/version.version={REGISTRY_VERSION}",
                  nosumdb="github.com/distribution")
_READY_TIMEOUT = 30.0


def ensure_registry(*, log: bool = True) -> Path:
    return REGISTRY.ensure(log=log)


def _config(*, root: Path, port: int, debug_port: int) -> str:
    return f"""version: 0.1
log:
  level: warn
  accesslog: {{disabled: true}}
storage:
  filesystem: {{rootdirectory: {root}}}
  delete: {{enabled: true}}
  maintenance:
    uploadpurging: {{enabled: false}}
http:
  addr: 127.0.0.1:{port}
  debug: {{addr: 127.0.0.1:{debug_port}}}
  headers:
    X-Content-Type-Options: [nosniff]
"""


@dataclass
class Registry:
    """A running registry; :meth:`stop` ends it and removes its storage."""

    host: str
    """``127.0.0.1:<port>``: the registry part of every reference pushed to it."""
    workdir: Path
    _process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def log(self) -> str:
        return (self.workdir / "registry.log").read_text(errors="replace")

    def tags(self, repository: str) -> list[str]:
        """The tags of ``repository`` (the registry's own ``/v2/<name>/tags/list``)."""
        import json

        try:
            with urllib.request.urlopen(f"{self.url}/v2/{repository}/tags/list", timeout=10) as reply:  # noqa: S310
                return list(json.loads(reply.read()).get("tags") or [])
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return []
            raise

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start() -> Registry:
    binary = ensure_registry(log=False)
    workdir = Path(tempfile.mkdtemp(prefix="stageset-registry-"))
    port = free_port()
    config = workdir / "config.yml"
    config.write_text(_config(root=workdir / "storage", port=port, debug_port=free_port()))
    log = (workdir / "registry.log").open("ab")
    process = subprocess.Popen([str(binary), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    log.close()
    registry = Registry(host=f"127.0.0.1:{port}", workdir=workdir, _process=process)
    deadline = time.monotonic() + _READY_TIMEOUT
    while True:
        if process.poll() is not None:
            text = registry.log()
            registry.stop()
            raise RuntimeError(f"the registry exited with {process.returncode}:\n{text[-3000:]}")
        try:
            with urllib.request.urlopen(f"{registry.url}/v2/", timeout=2):  # noqa: S310
                return registry
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                registry.stop()
                raise RuntimeError(f"the registry did not answer on {registry.url} in {_READY_TIMEOUT:.0f}s"
                                   ) from None
            time.sleep(0.1)


@contextlib.contextmanager
def running() -> Iterator[Registry]:
    registry = start()
    try:
        yield registry
    finally:
        registry.stop()


if __name__ == "__main__":
    sys.exit(REGISTRY.main(sys.argv[1:], generator="python -m stageset.envtest.registry"))
