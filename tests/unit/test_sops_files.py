"""Which files of a stage's build are SOPS files, and in which format (pure: no keys, no helper)."""

from __future__ import annotations

import pytest

from stageset.build import BuildError, prepare

META_YAML = b"sops:\n  mac: ENC[AES256_GCM,data:x,iv:y,tag:z,type:str]\n  version: 3.13.3\n"
SOPS_YAML = b"apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {a: 'ENC[...]'}\n" + META_YAML
SOPS_JSON = b'{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "j"}, "sops": {"mac": "x"}}'
SOPS_ENV = b"A=ENC[AES256_GCM,data:x]\nsops_mac=ENC[x]\nsops_version=3.13.3\n"
SOPS_INI = b"[main]\na = ENC[x]\n\n[sops]\nmac = ENC[x]\n"
SOPS_BINARY = b'{"data": "ENC[x]", "sops": {"mac": "ENC[x]"}}'
CM = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"


@pytest.mark.parametrize(("files", "path", "expected", "withheld"), [
    # a plain path: every manifest file is read, SOPS ones decrypted whole
    ({"p/a.yaml": SOPS_YAML, "p/b.json": SOPS_JSON, "p/c.yaml": CM}, "p",
     {"p/a.yaml": "yaml", "p/b.json": "json"}, ()),
    # kustomize resources and generator sources, each in its format
    ({"k/kustomization.yaml": b"resources: [s.yaml]\nsecretGenerator:\n- name: g\n  envs: [x.txt]\n"
                              b"  files: [c.ini, tls.key, d.env]\n",
      "k/s.yaml": SOPS_YAML, "k/x.txt": SOPS_ENV, "k/c.ini": SOPS_INI, "k/tls.key": SOPS_BINARY,
      "k/d.env": SOPS_ENV}, "k",
     {"k/s.yaml": "yaml", "k/x.txt": "dotenv", "k/c.ini": "ini", "k/tls.key": "binary",
      "k/d.env": "dotenv"}, ()),
    # a generator file that is not SOPS' binary format is untouched, so is an unnamed .env
    ({"g/kustomization.yaml": b"secretGenerator:\n- name: g\n  files: [tls.key]\n",
      "g/tls.key": b"sops\x00\xff", "g/other.env": SOPS_ENV}, "g", {}, ()),
    # a SOPS file beside a kustomization that nothing names is withheld from the build
    ({"w/kustomization.yaml": b"resources: [cm.yaml]\n", "w/cm.yaml": CM, "w/old.enc.yaml": SOPS_YAML}, "w",
     {}, ("w/old.enc.yaml",)),
    # a generator reading a directory
    ({"d/kustomization.yaml": b"secretGenerator:\n- name: g\n  files: [conf/]\n", "d/conf/a.yaml": SOPS_YAML},
     "d", {"d/conf/a.yaml": "yaml"}, ()),
])
def test_sops_files_of_a_build(files: dict[str, bytes], path: str, expected: dict[str, str],
                               withheld: tuple[str, ...]) -> None:
    assert prepare(files, path=path).sops_files() == (expected, withheld)


@pytest.mark.parametrize(("files", "message"), [
    ({"c/kustomization.yaml": b"configMapGenerator:\n- name: c\n  envs: [x.env]\n", "c/x.env": SOPS_ENV},
     "c/x.env: SOPS-encrypted, and read by a configMapGenerator"),
    ({"c/kustomization.yaml": b"configMapGenerator:\n- name: c\n  files: [x.yaml]\n", "c/x.yaml": SOPS_YAML},
     "c/x.yaml: SOPS-encrypted, and read by a configMapGenerator"),
])
def test_refused_sops_files(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(BuildError, match=message):
        prepare(files, path="c").sops_files()


def test_an_encrypted_kustomization_is_refused() -> None:
    with pytest.raises(BuildError, match="a kustomization cannot be SOPS-encrypted"):
        prepare({"k/kustomization.yaml": b"resources: [a.yaml]\n" + META_YAML, "k/a.yaml": CM}, path="k")
