"""The README is the package index page too (issue 20, item 1): it opens with the pip command and
the extras, and its links are absolute, since relative ones die there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYPROJECT = (ROOT / "pyproject.toml").read_text()  # read as text: tomllib is Python 3.11+, the package 3.10+


def project_table(name: str) -> str:
    return PYPROJECT.split(f"\n[{name}]\n", 1)[1].split("\n[", 1)[0]


def test_every_link_in_the_readme_is_absolute():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert links, "the README links its docs"
    assert [link for link in links if not link.startswith(("https://", "#"))] == []


def test_the_readme_links_the_repository_named_in_the_project_urls():
    source = re.search(r'^Source = "([^"]+)"$', project_table("project.urls"), re.MULTILINE).group(1)  # type: ignore[union-attr]
    links = re.findall(r"\]\((https://[^)\s]+)\)", README)
    ours = [link for link in links if "/docs/" in link or link.endswith(".md")]
    assert ours and all(link.startswith(f"{source}/blob/main/") for link in ours)


def test_the_readme_opens_with_the_pip_command_and_every_extra():
    first_section = README[README.index("\n## ") :].split("\n## ")[1]
    assert first_section.startswith('Install\n\n```bash\npip install "stateful-sampler[lightning]"\n```')
    extras = re.findall(r"^([a-z-]+) = \[", project_table("project.optional-dependencies"), re.MULTILINE)
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", first_section, re.MULTILINE))
    assert listed == set(extras) - {"dev", "test"}  # the developers' own
    assert README.index("make demo") > README.index('pip install "stateful-sampler[lightning]"')
