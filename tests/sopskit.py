"""SOPS fixtures made during the test run by the real tools: ``sops`` and ``age-keygen`` (the
pinned release, built from the Go module proxy by :mod:`stageset.envtest.sops`) and ``gpg``
(Debian's, installed by hack/bootstrap.sh).  Nothing is checked in: every key is generated and
every file encrypted here, so what the helper decrypts is exactly what a user's ``sops`` wrote.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stageset.build.decrypt import DecryptionKeys
from stageset.envtest import sops as sops_tools

SECRET_REGEX = "^(data|stringData)$"


@dataclass
class AgeKey:
    identity: bytes = field(repr=False)
    """The age-keygen file (a comment line and the AGE-SECRET-KEY-1... line)."""
    recipient: str


@dataclass
class PgpKey:
    armored: bytes = field(repr=False)
    fingerprint: str
    home: Path


class SopsKit:
    """The real ``sops``, ``age-keygen`` and ``gpg``, each run in a scratch directory."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.sops = sops_tools.ensure("sops", log=False)
        self.age_keygen = sops_tools.ensure("age-keygen", log=False)
        self._count = 0
        self.gnupg_homes: list[Path] = []

    def _env(self, home: Path | None = None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir),
               # sops looks for .sops.yaml upwards from the file; there is none under the workdir.
               "SOPS_AGE_KEY_FILE": "/nonexistent"}
        if home is not None:
            env["GNUPGHOME"] = str(home)
        return env

    def age_key(self) -> AgeKey:
        result = subprocess.run([str(self.age_keygen)], capture_output=True, check=True, env=self._env())
        match = re.search(rb"public key: (age1[0-9a-z]+)", result.stdout)
        assert match is not None, result.stdout
        return AgeKey(identity=result.stdout, recipient=match.group(1).decode())

    def pgp_key(self) -> PgpKey:
        # gpg's agent socket lives in GNUPGHOME: keep the path short.
        home = Path(tempfile.mkdtemp(prefix="gpg-", dir="/tmp"))
        home.chmod(0o700)
        self.gnupg_homes.append(home)
        gpg = ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
        subprocess.run([*gpg, "--quick-gen-key", "stageset test <test@example.invalid>", "future-default",
                        "default", "never"], capture_output=True, check=True, env=self._env(home))
        listing = subprocess.run(["gpg", "--batch", "--with-colons", "--list-secret-keys"],
                                 capture_output=True, check=True, env=self._env(home)).stdout.decode()
        fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        armored = subprocess.run([*gpg, "--armor", "--export-secret-keys", fingerprint], capture_output=True,
                                 check=True, env=self._env(home)).stdout
        return PgpKey(armored=armored, fingerprint=fingerprint, home=home)

    def encrypt(self, content: str | bytes, *, name: str, age: list[AgeKey] | None = None,
                pgp: PgpKey | None = None, regex: str | None = None, input_type: str | None = None) -> bytes:
        """``content`` encrypted by ``sops --encrypt`` as the file ``name`` (its suffix picks the format)."""
        self._count += 1
        directory = self.workdir / f"f{self._count}"
        directory.mkdir()
        path = directory / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        command = [str(self.sops), "--encrypt"]
        if age:
            command += ["--age", ",".join(key.recipient for key in age)]
        if pgp is not None:
            command += ["--pgp", pgp.fingerprint]
        if regex:
            command += ["--encrypted-regex", regex]
        if input_type:
            command += ["--input-type", input_type, "--output-type", input_type]
        result = subprocess.run([*command, str(path)], capture_output=True, cwd=directory,
                                env=self._env(pgp.home if pgp else None))
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout

    def close(self) -> None:
        for home in self.gnupg_homes:
            # Stop the agent this kit's gpg started (its socket is in this home), then remove it.
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], capture_output=True, env=self._env(home),
                           check=False)
            shutil.rmtree(home, ignore_errors=True)


def keys_of(*, age: Sequence[AgeKey] = (), pgp: Sequence[PgpKey] = ()) -> DecryptionKeys:
    return DecryptionKeys.from_secret_data("test/keys", secret_data(age=age, pgp=pgp))


def secret_data(*, age: Sequence[AgeKey] = (), pgp: Sequence[PgpKey] = ()) -> dict[str, str]:
    """A key Secret's ``data``, as Flux names the entries."""
    data = {f"key{i}.agekey": base64.b64encode(key.identity).decode() for i, key in enumerate(age)}
    data.update({f"key{i}.asc": base64.b64encode(key.armored).decode() for i, key in enumerate(pgp)})
    return data


@pytest.fixture(scope="session")
def sops_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SopsKit]:
    if shutil.which("gpg") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("gpg is missing (hack/bootstrap.sh installs Debian's gnupg)", pytrace=False)
        pytest.skip("gpg is missing (hack/bootstrap.sh installs Debian's gnupg)")
    kit = SopsKit(tmp_path_factory.mktemp("sops"))
    try:
        yield kit
    finally:
        kit.close()
