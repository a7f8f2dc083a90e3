"""The docs site: every reason has a runbook the controller's links reach, generated pages are
current, and the offline build fails on a broken link (so the test command's build means something)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from stageset.api.vocabulary import Reason
from stageset.controller.settings import DEFAULT_RUNBOOK_BASE_URL
from stageset.controller.status import runbook_url
from stageset.envtest import docs

ROOT = Path(__file__).resolve().parents[2]


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _config() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return loaded


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = _mkdocs(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("reason", list(Reason), ids=[r.value for r in Reason])
def test_every_reason_has_a_runbook_the_controller_links_reach(reason: Reason, site: Path) -> None:
    page = docs.runbook_page(reason)
    assert page.exists(), f"no runbook for {reason.value}: write {page.relative_to(ROOT)}"
    text = page.read_text()
    assert text.startswith(f"# {reason.value}\n")
    for section in ("## What the controller does", "## What to do"):
        assert section in text, f"{page.name} lacks {section!r}"
    # The link a condition message ends with lands on that page of the built site.
    url = runbook_url(DEFAULT_RUNBOOK_BASE_URL, reason)
    relative = url.removeprefix(str(_config()["site_url"]))
    assert relative != url, "the runbook base URL must be under the site's URL"
    assert (site / relative / "index.html").is_file(), relative


def test_the_runbook_base_url_is_the_sites_runbooks_section() -> None:
    assert str(_config()["site_url"]) + "runbooks/" == DEFAULT_RUNBOOK_BASE_URL


def test_the_site_loads_nothing_from_another_host(site: Path) -> None:
    """Every script, stylesheet, image and font of every page is the site's own: it works offline
    and tells no CDN who reads it (the theme's highlight.js came from cdnjs; Pygments highlights at
    build time instead)."""
    tag = re.compile(r"<(?:script|link|img|source|iframe)\b[^>]*>", re.IGNORECASE)
    loads_from_afar = re.compile(r"""\b(?:src|href)=["'](?:https?:)?//""", re.IGNORECASE)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 40
    offenders = sorted({f"{page.relative_to(site)}: {found}" for page in pages
                        for found in tag.findall(page.read_text())
                        # rel=canonical names the page's published address; nothing is loaded from it
                        if loads_from_afar.search(found) and 'rel="canonical"' not in found})
    assert offenders == []
    styles = "".join(p.read_text() for p in site.rglob("*.css"))
    assert "@import url(http" not in styles
    assert "url(//" not in styles
    assert 'class="codehilite"' in (site / "install" / "index.html").read_text()  # still highlighted


def test_generated_pages_are_current() -> None:
    stale = [str(p.relative_to(ROOT)) for p in docs.stale()]
    assert stale == [], f"run `make docs`: {stale} not current"


def test_the_generated_references_cover_the_code() -> None:
    from stageset.cli.main import main
    from stageset.cli.verbs import VerbGroup

    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()

    def sections(path: tuple[str, ...], command: click.Command) -> list[str]:
        # A group (`create`, `delete`) has a section per subcommand (`stageset create tenant`,
        # `stageset create source git`); a verb (`get`) its own and one per kind (`get sources git`).
        if not isinstance(command, click.Group):
            return [" ".join(path)]
        found = [" ".join(path)] if isinstance(command, VerbGroup) else []
        context = click.Context(command)
        for sub in command.list_commands(context):
            found += sections((*path, sub), command.commands[sub])
        return found

    expected = sections(("stageset",), main)
    assert {"stageset get", "stageset get sources git", "stageset create source git", "stageset logs"} <= set(
        expected
    )
    for section in expected:
        assert f"## `{section}`" in cli, section
    assert "--runbook-base-url" in cli
    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    for field in (
        "spec.stages[].dependsOn",
        "spec.stages[].postBuild.substituteFrom[].kind",
        "status.inventory[].entries[].id",
        "spec.ref.semver",
        "status.artifact.revision",
    ):
        assert f"| `{field}` |" in api, field


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "comparison.md").open("a") as page:
        page.write("\nSee [the old page](operations.md#no-such-section).\n")
    result = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stderr


def test_readme_links_point_at_existing_files() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((?!https?://)([^)#]+)(?:#[^)]*)?\)", text)
    assert targets, "README.md links nowhere?"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []
