"""The README is the package index page too (issue 20, item 1): it opens with the pip command and
the extras, and its links are absolute, since relative ones die there. What only a checkout needs is
in CONTRIBUTING.md (issue 25, item 23); the README keeps the two commands that set up a fresh machine."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()
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
    marker = "<!-- not run: installs the package -->\n"  # tests/docs/test_code_blocks.py: a block not run says why
    assert first_section.startswith(f'Install\n\n{marker}```bash\npip install "stateful-sampler[lightning]"\n```')
    extras = re.findall(r"^([a-z-]+) = \[", project_table("project.optional-dependencies"), re.MULTILINE)
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", first_section, re.MULTILINE))
    assert listed == set(extras) - {"dev", "test"}  # the developers' own
    assert README.index("make demo") > README.index('pip install "stateful-sampler[lightning]"')


def _extras() -> list[str]:
    return re.findall(r"^([a-z-]+) = \[", project_table("project.optional-dependencies"), re.MULTILINE)


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)


# What only a checkout has: the Makefile's set-up and benchmark targets, the venv it builds, the repository's
# configs, CI, and the layout of the tree.
CHECKOUT_ONLY = (".venv/bin", "configs/", "make install", "make bench", "TEST_WORKERS", ".ci/run", "## Layout")


def test_the_readme_keeps_the_two_set_up_commands_and_leaves_the_rest_of_a_checkout_to_contributing():
    section = README.split("\n## From a checkout: demo and tests\n", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in _code_blocks(section)[0].splitlines()]
    assert commands == ["make demo", "make test"]
    source = re.search(r'^Source = "([^"]+)"$', project_table("project.urls"), re.MULTILINE).group(1)  # type: ignore[union-attr]
    assert f"]({source}/blob/main/CONTRIBUTING.md)" in section
    assert [text for text in CHECKOUT_ONLY if text in README] == []
    assert [text for text in CHECKOUT_ONLY if text not in CONTRIBUTING] == []


def test_the_extras_table_says_exactly_which_extras_all_leaves_out():
    members = re.search(r'^all = \["stateful-sampler\[([a-z,-]+)\]"\]', project_table("project.optional-dependencies"),
                        re.MULTILINE).group(1).split(",")  # type: ignore[union-attr]  # fmt: skip
    left_out = [extra for extra in _extras() if extra not in {*members, "all", "dev", "test"}]
    row = re.search(r"^\| `all` \| (.*) \|$", README, re.MULTILINE).group(1)  # type: ignore[union-attr]
    assert row == "every extra above" + (" but " + ", ".join(f"`{extra}`" for extra in left_out) if left_out else "")


def test_the_demo_block_installs_the_demo_extra_and_prints_configs_with_the_demos_own_flag():
    block = next(block for block in _code_blocks(README) if "python -m stateful_sampler.demo" in block)
    assert block.splitlines()[0] == 'pip install "stateful-sampler[demo]"'
    assert "python -m stateful_sampler.demo --shipped-config > digits.yaml" in block
    assert "--print-config" not in README  # read like LightningCLI's own --print_config


def test_contributing_lays_out_each_top_level_folder_once_and_only_folders_that_exist():
    tree = _code_blocks(CONTRIBUTING.split("\n## Layout\n", 1)[1])[0]
    tops = [line.split()[0] for line in tree.splitlines() if line and not line.startswith(" ")]
    assert len(tops) == len(set(tops)), tops
    assert {"src/stateful_sampler/", "benchmarks/", "configs/", "docs/", "examples/", "tests/"} <= set(tops)
    assert [top for top in tops if not (ROOT / top).is_dir()] == []
