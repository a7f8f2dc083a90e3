"""SOPS decryption with the real helper, on files the real ``sops`` encrypted during this run.

Every format Flux decrypts (YAML and JSON manifests whole, and the dotenv, INI and binary files
a ``secretGenerator`` reads), age and OpenPGP keys, key groups of several recipients, and every
failure: a wrong key, a tampered value, a tampered MAC, a file for cloud KMS only, a key entry
that is not a key, too many values.  Each failure message is checked to name the file and to
hold no plaintext and no key.  Then the render cache: a decrypted render is never served to
another StageSet, a rotated key re-decrypts, a plain render is still shared.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.build import BuildError, BuildLimits, prepare, render
from stageset.build.decrypt import DecryptionError, DecryptionKeys, decrypt, ensure_helper
from stageset.controller.redact import forms
from stageset.controller.render.cache import RenderCache, SourceRoot, render_stage
from tests.build.conftest import _binary
from tests.sopskit import SECRET_REGEX, AgeKey, PgpKey, SopsKit, keys_of, sops_kit

__all__ = ["sops_kit"]

PASSWORD = "correct-horse-battery-staple-7f3a"
TOKEN = "tok_9c2e81d4b5a0"
INI_VALUE = "ini-value-5d1e77"
BINARY = b"-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
SECRET = f"""apiVersion: v1
kind: Secret
metadata:
  name: db
stringData:
  password: {PASSWORD}
"""


@pytest.fixture(scope="module")
def helper() -> Path:
    return _binary(ensure_helper, "stageset-sops")


@pytest.fixture(scope="module")
def age(sops_kit: SopsKit) -> AgeKey:
    return sops_kit.age_key()


@pytest.fixture(scope="module")
def other_age(sops_kit: SopsKit) -> AgeKey:
    return sops_kit.age_key()


@pytest.fixture(scope="module")
def pgp(sops_kit: SopsKit) -> PgpKey:
    return sops_kit.pgp_key()


def build(files: Mapping[str, bytes], path: str, keys: DecryptionKeys, helper: Path,
          limits: BuildLimits | None = None) -> tuple[list[Any], frozenset[str]]:
    prepared = prepare(files, path=path, limits=limits)
    found, withheld = prepared.sops_files()
    opened = decrypt({n: files[n] for n in found}, found, keys=keys, limits=prepared.limits, helper=helper)
    return render(prepared.with_decrypted(opened.files, withheld)), opened.values


def secret_value(objects: list[Any], name: str, key: str) -> str:
    obj = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].startswith(name))
    if key in (obj.get("stringData") or {}):
        return str(obj["stringData"][key])
    return base64.b64decode(obj["data"][key]).decode()


def assert_secret_free(message: str, *secrets: str | bytes) -> None:
    for secret in secrets:
        text = secret.decode() if isinstance(secret, bytes) else secret
        for line in [text, *text.splitlines()]:
            if len(line.strip()) >= 8:
                for form in forms(line.strip()):
                    assert form not in message, f"{form!r} leaked into: {message}"


def test_every_format_flux_decrypts_with_age_and_openpgp(sops_kit: SopsKit, age: AgeKey, pgp: PgpKey,
                                                         helper: Path) -> None:
    files = {
        "app/kustomization.yaml": b"resources: [secret.enc.yaml, config.enc.json]\n"
                                  b"secretGenerator:\n"
                                  b"- name: env\n  envs: [app.enc.env]\n"
                                  b"- name: files\n  files: [settings.ini, tls.key]\n",
        # age, only data/stringData encrypted (the usual Secret layout)
        "app/secret.enc.yaml": sops_kit.encrypt(SECRET, name="s.yaml", age=[age], regex=SECRET_REGEX),
        # OpenPGP, a whole JSON manifest (any kind)
        "app/config.enc.json": sops_kit.encrypt(json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "config"},
            "data": {"mode": "strict"}}), name="c.json", pgp=pgp),
        # dotenv, INI and binary files a secretGenerator reads; two recipients (age and OpenPGP)
        "app/app.enc.env": sops_kit.encrypt(f"TOKEN={TOKEN}\nPLAIN=x\n", name="a.env", age=[age], pgp=pgp),
        "app/settings.ini": sops_kit.encrypt(f"[main]\nvalue = {INI_VALUE}\n", name="settings.ini",
                                             age=[age]),
        "app/tls.key": sops_kit.encrypt(BINARY, name="tls.key", age=[age]),
        "app/README.md": b"sops is mentioned here, but this file is not SOPS-encrypted\n",
    }
    prepared = prepare(files, path="app")
    found, withheld = prepared.sops_files()
    assert found == {"app/secret.enc.yaml": "yaml", "app/config.enc.json": "json",
                     "app/app.enc.env": "dotenv", "app/settings.ini": "ini", "app/tls.key": "binary"}
    assert withheld == ()
    for keys in (keys_of(age=[age], pgp=[pgp]), ):
        objects, values = build(files, "app", keys, helper)
        assert secret_value(objects, "db", "password") == PASSWORD
        assert secret_value(objects, "env-", "TOKEN") == TOKEN
        assert INI_VALUE in secret_value(objects, "files-", "settings.ini")
        assert secret_value(objects, "files-", "tls.key") == BINARY.decode()
        config = next(o for o in objects if o["kind"] == "ConfigMap")
        assert config["data"] == {"mode": "strict"}
        assert "sops" not in config
        assert {PASSWORD, TOKEN, "strict", BINARY.decode()} <= values
    # An OpenPGP key alone opens the file that has an OpenPGP recipient.
    only_pgp = {"p/cm.enc.json": files["app/config.enc.json"]}
    objects, _ = build(only_pgp, "p", keys_of(pgp=[pgp]), helper)
    assert objects[0]["data"] == {"mode": "strict"}


def test_plain_paths_and_files_without_metadata_are_untouched(sops_kit: SopsKit, age: AgeKey,
                                                              helper: Path) -> None:
    plain = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: sops}\ndata: {sops: 'ENC[not really]'}\n"
    files = {"p/secret.yaml": sops_kit.encrypt(SECRET, name="s.yaml", age=[age], regex=SECRET_REGEX),
             "p/plain.yaml": plain}
    prepared = prepare(files, path="p")
    found, _ = prepared.sops_files()
    assert found == {"p/secret.yaml": "yaml"}
    objects, _ = build(files, "p", keys_of(age=[age]), helper)
    assert secret_value(objects, "db", "password") == PASSWORD
    assert next(o for o in objects if o["kind"] == "ConfigMap")["data"] == {"sops": "ENC[not really]"}


def failure(files: Mapping[str, bytes], path: str, keys: DecryptionKeys, helper: Path,
            limits: BuildLimits | None = None) -> str:
    with pytest.raises(BuildError) as caught:
        build(files, path, keys, helper, limits)
    return str(caught.value)


def test_failures_name_the_file_and_a_reason_and_hold_no_secret(sops_kit: SopsKit, age: AgeKey,
                                                                other_age: AgeKey, pgp: PgpKey,
                                                                helper: Path) -> None:
    encrypted = sops_kit.encrypt(SECRET, name="s.yaml", age=[age], regex=SECRET_REGEX)
    secrets = (PASSWORD, age.identity, other_age.identity, pgp.armored)

    wrong = failure({"w/s.yaml": encrypted}, "w", keys_of(age=[other_age], pgp=[pgp]), helper)
    assert wrong.startswith("w/s.yaml: no key matches the file's recipients"), wrong
    assert age.recipient in wrong  # the public recipient helps to find the right key
    assert_secret_free(wrong, *secrets)

    document = yaml.safe_load(encrypted)
    document["metadata"]["name"] = "renamed"  # an unencrypted value: only the MAC can tell
    tampered = failure({"t/s.yaml": yaml.safe_dump(document).encode()}, "t", keys_of(age=[age]), helper)
    assert tampered == "t/s.yaml: MAC mismatch: the file was changed after it was encrypted", tampered

    document = yaml.safe_load(encrypted)
    value = document["stringData"]["password"]
    data = value.split("data:")[1].split(",")[0]
    flipped = ("A" if data[0] != "A" else "B") + data[1:]
    document["stringData"]["password"] = value.replace(f"data:{data}", f"data:{flipped}")
    broken = failure({"b/s.yaml": yaml.safe_dump(document).encode()}, "b", keys_of(age=[age]), helper)
    assert broken.startswith("b/s.yaml: a value cannot be decrypted"), broken

    document = yaml.safe_load(encrypted)
    entry = document["sops"].pop("age")[0]
    document["sops"]["kms"] = [{"arn": "arn:aws:kms:eu-west-1:000000000000:key/test", "enc": entry["enc"],
                                "created_at": "2026-01-01T00:00:00Z", "aws_profile": ""}]
    kms = failure({"k/s.yaml": yaml.safe_dump(document).encode()}, "k", keys_of(age=[age]), helper)
    assert "encrypted only for kms keys" in kms, kms
    assert "cloud KMS is not supported" in kms, kms

    not_a_key = DecryptionKeys.from_secret_data("ns/keys", {
        "broken.agekey": base64.b64encode(b"AGE-SECRET-KEY-1NOTAKEY" + PASSWORD.encode()).decode()})
    bad = failure({"x/s.yaml": encrypted}, "x", not_a_key, helper)
    assert bad == ('key Secret ns/keys: entry "broken.agekey" is not an age identity file '
                   "(lines AGE-SECRET-KEY-1..., comments starting with #)"), bad
    assert_secret_free(bad, *secrets)

    none = failure({"n/s.yaml": encrypted}, "n", DecryptionKeys.from_secret_data("ns/keys", {"x": "eA=="}),
                   helper)
    assert "holds no entry ending in .agekey or .asc" in none


def test_many_values_are_refused_in_bounded_time(sops_kit: SopsKit, age: AgeKey, helper: Path) -> None:
    """1,500 distinct values (the limit is 1,000): refused by the helper, quickly, naming the limit."""
    values = {f"k{i}": f"value-{i:05d}-{'x' * 16}" for i in range(1500)}
    manifest = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "many"}, "stringData": values}
    encrypted = sops_kit.encrypt(yaml.safe_dump(manifest), name="m.yaml", age=[age], regex=SECRET_REGEX)
    started = time.monotonic()
    message = failure({"m/s.yaml": encrypted}, "m", keys_of(age=[age]), helper)
    assert "more than 1000 encrypted values" in message, message
    assert time.monotonic() - started < 30  # a generous bound, not a benchmark
    # With the limit raised (--build-limit max_encrypted_values=2000) the same file decrypts.
    objects, opened = build({"m/s.yaml": encrypted}, "m", keys_of(age=[age]), helper,
                            BuildLimits(max_encrypted_values=2000))
    assert len(objects[0]["stringData"]) == 1500
    assert len(opened) >= 1500


class _Decryption:
    def __init__(self, scope: str, keys: DecryptionKeys):
        self.scope = scope
        self.current = keys
        self.revealed: set[str] = set()
        self.reads = 0

    def keys(self) -> DecryptionKeys:
        self.reads += 1
        return self.current

    def reveal(self, values: frozenset[str]) -> None:
        self.revealed |= values


def test_decrypted_renders_are_never_served_to_another_stageset(sops_kit: SopsKit, age: AgeKey,
                                                                other_age: AgeKey, helper: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGESET_SOPS_HELPER", str(helper))
    cache = RenderCache()
    files = {"s/secret.yaml": sops_kit.encrypt(SECRET, name="s.yaml", age=[age], regex=SECRET_REGEX),
             "p/cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain}\n"}

    def run(path: str, decryption: _Decryption | None) -> list[Any]:
        return render_stage(cache, url="https://git.example/r", commit="c" * 40, ignore=None, path=path,
                            variables=None, read_tree=lambda: SourceRoot(files=files), limits=BuildLimits(),
                            decryption=decryption)

    a = _Decryption("team-a/app", keys_of(age=[age]))
    assert secret_value(run("s", a), "db", "password") == PASSWORD
    assert PASSWORD in a.revealed
    assert cache.builds == 1
    assert secret_value(run("s", a), "db", "password") == PASSWORD  # a hit: the key is read again
    assert cache.builds == 1
    assert a.reads == 2

    # Another StageSet with the same key decrypts for itself; one without keys fails.
    b = _Decryption("team-a/other", keys_of(age=[age]))
    assert secret_value(run("s", b), "db", "password") == PASSWORD
    assert cache.builds == 2
    assert PASSWORD in b.revealed
    with pytest.raises(BuildError, match=r"SOPS-encrypted, and this StageSet has no spec\.decryption"):
        run("s", None)

    # A rotated key Secret: decrypted again on the next pass (and a key that no longer fits fails).
    a.current = keys_of(age=[other_age])
    with pytest.raises(DecryptionError, match="no key matches"):
        run("s", a)
    a.current = keys_of(age=[other_age, age])
    assert secret_value(run("s", a), "db", "password") == PASSWORD
    assert cache.builds == 3

    # A stage without SOPS files is still rendered once for everyone, and reads no key.
    reads = a.reads
    run("p", a)
    run("p", b)
    run("p", None)
    assert cache.builds == 4
    assert a.reads == reads
