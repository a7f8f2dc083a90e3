"""Running the real ``helm`` binary against the chart, and reading what it renders."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "stageset"


@dataclass
class Helm:
    binary: Path
    home: Path  # HELM_CACHE_HOME & co: nothing of the user's helm set-up leaks into the tests
    kubeconfig: Path | None = None

    def env(self) -> dict[str, str]:
        env = {**os.environ, "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_CONFIG_HOME": str(self.home / "config"), "HELM_DATA_HOME": str(self.home / "data")}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def start(self, *args: str) -> subprocess.Popen[str]:
        """``helm ARGS`` in the background (e.g. an uninstall that waits for its hook Job)."""
        return subprocess.Popen([str(self.binary), *args], env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.binary), *args], env=self.env(), capture_output=True, text=True,
                                check=False, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def template(self, *args: str, release: str = "stageset", namespace: str = "stageset-system",
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("template", release, str(CHART), "--namespace", namespace, *args, check=check)

    def render(self, *args: str, release: str = "stageset",
               namespace: str = "stageset-system") -> list[dict[str, Any]]:
        return documents(self.template(*args, release=release, namespace=namespace).stdout)


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    names = [d["metadata"]["name"] for d in found]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {names}"
    return found[0]


def controller_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(docs, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "controller")


def controller_args(docs: list[dict[str, Any]]) -> list[str]:
    """The flags the Deployment gives ``stageset controller`` (the image's entrypoint)."""
    return list(controller_container(docs)["args"])


def hook(doc: dict[str, Any]) -> str:
    """The Helm hook(s) an object belongs to (``pre-install,pre-upgrade``), empty for the release's own."""
    return str((doc["metadata"].get("annotations") or {}).get("helm.sh/hook", ""))


def without_hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The release's own objects: what the chart renders without its hook Jobs and their rights."""
    return [d for d in docs if not hook(d)]
