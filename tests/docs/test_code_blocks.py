"""Every fenced code block in README.md and docs/*.md runs, or says why not (issue 29, item 9), so that what
a reader copies cannot drift from the code. One test case a block, named by its file and line.

A block is marked by the line directly above its opening fence:

- ``<!-- not run: REASON -->``: not executed, for the reason given (it needs a cluster, installs packages, is
  a fragment over the reader's own data and model, is a synopsis). A marker without a reason fails. A python
  block marked so still compiles, and its imports of ``stateful_sampler`` must name modules and names that exist
  (read from the modules' sources, so that no framework is imported for a fragment).
- ``<!-- output: WHAT PRINTS IT -->``: the block is what a command or call prints, shown as an example.

What "runs" means, per language:

- ``python``: executed. The python blocks of one page run in order in one fresh process (tests/docs/run_page.py),
  in a fresh temporary working directory, sharing one namespace: a block may use what the page's blocks above
  it defined. Everything of this package or another library that a block uses, it imports or a block above
  it imported. What the reader brings (a dataset, labels, a model, a training step, shard files) the page's
  prelude in tests/docs/preludes.py defines, small, before the first block.
- ``bash``, ``sh``, ``shell``, ``console``: run, in the same directory, when every command is this package's own
  (``stateful-sampler ...``, ``python -m stateful_sampler...``: safe and cheap); anything else (installs,
  training runs, launchers, ``make``) is marked. A plain ``stateful-sampler`` command runs in the page's process
  through the function its entry point calls, the rest in bash. In a ``console`` block the lines starting with
  ``$ `` are the commands and the lines under each are its output, compared with what it prints (``...`` or
  ``…`` stands for any text; whitespace is normalised).
- ``json``, ``yaml``, ``toml``: parsed (json.loads, yaml.safe_load, tomllib).
- any other language, and a block without one: marked (output or not run).

A page's blocks run in under 5 s of CPU; a page that needs longer is in ``SLOW_PAGES`` and its cases are marked slow.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.docs.preludes import PRELUDES
from tests.docs.run_page import check_imports, shell_commands

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNER = Path(__file__).with_name("run_page.py")
SHELL = {"bash", "sh", "shell", "console"}


def parse_toml(text: str) -> object:
    import tomllib  # Python 3.11+: imported only when a page has a toml block

    return tomllib.loads(text)


PARSERS = {"json": json.loads, "yaml": yaml.safe_load, "toml": parse_toml}
# Pages whose blocks take longer than 5 s (CPU) to run, by path from the root: their cases are marked slow.
SLOW_PAGES = {"docs/engines.md"}  # a Lightning Trainer: importing Lightning alone is about 4 s
PAGE_TIMEOUT = 300  # seconds for one page's blocks, whatever happens

# The shell commands cheap and safe to run from a doc: this package's own command line (--help, --version, a
# small audit). Anything else in a shell block (pip, make, training runs, launchers) needs a marker.
SAFE_COMMAND = re.compile(r"^(stateful-sampler|python -m stateful_sampler(\.\w+)*)(\s|$)")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<language>[\w+-]*)")
MARKER = re.compile(r"^<!--\s*(?P<kind>not run|output)\b\s*:?\s*(?P<reason>.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str  # path from the root
    line: int  # of the opening fence, from 1
    language: str
    source: str
    marker: str | None  # "not run" or "output"
    reason: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    page = path.relative_to(root).as_posix()
    lines = path.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = next(
            (at for at in range(index + 1, len(lines)) if lines[at].strip().startswith(fence)),
            None,
        )
        assert end is not None, f"{page}:{index + 1}: a code block that is never closed"
        source = "\n".join(line.removeprefix(indent) for line in lines[index + 1 : end]) + "\n"
        above = MARKER.match(lines[index - 1].strip()) if index else None
        found.append(
            Block(
                page,
                index + 1,
                opening["language"].lower(),
                source,
                above["kind"] if above else None,
                above["reason"] if above else "",
            )
        )
        index = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def is_run(block: Block) -> bool:
    if block.marker is not None:
        return False
    if block.language in SHELL:
        return all(SAFE_COMMAND.match(command) for command, _ in shell_commands(block.language, block.source))
    return block.language == "python"


@functools.cache
def page_results(page: str) -> dict[int, str | None]:
    """Runs the page's python and shell blocks once, in order, in a fresh process and directory: line -> error."""
    blocks = [block for block in BLOCKS if block.page == page and (block.language == "python" or is_run(block))]
    with tempfile.TemporaryDirectory(prefix="doc-blocks-") as work:
        listing, results = Path(work, ".blocks.json"), Path(work, ".results.json")
        prelude = {
            "name": f"{page} (its prelude in tests/docs/preludes.py)",
            "language": "python",
            "source": PRELUDES.get(page, ""),
            "run": True,
        }
        listing.write_text(
            json.dumps(
                [prelude]
                + [
                    {"name": block.name, "language": block.language, "source": block.source, "run": is_run(block)}
                    for block in blocks
                ]
            )
        )
        done = subprocess.run(
            [sys.executable, str(RUNNER), str(listing), str(results)],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=PAGE_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, f"the runner of {page} failed:\n{done.stdout}{done.stderr}"
        prelude_result, *errors = json.loads(results.read_text())
    assert prelude_result["error"] is None, f"the prelude of {page} failed:\n{prelude_result['error']}"
    return {block.line: result["error"] for block, result in zip(blocks, errors, strict=True)}


def case(block: Block) -> object:
    marks = [pytest.mark.slow] if block.page in SLOW_PAGES else []
    return pytest.param(block, id=block.name, marks=marks)


@pytest.mark.parametrize("block", [case(block) for block in BLOCKS])
def test_every_code_block_runs_or_says_why_not(block: Block) -> None:
    if block.marker is not None:
        assert block.reason, f"{block.name}: `<!-- {block.marker}: REASON -->` needs its reason after the colon"
    if block.language == "python" or is_run(block):
        error = page_results(block.page)[block.line]
        assert error is None, f"{block.name} ({block.language}) failed:\n{error}"
    elif block.marker is None and block.language in SHELL:
        unsafe = [
            command for command, _ in shell_commands(block.language, block.source) if not SAFE_COMMAND.match(command)
        ]
        pytest.fail(
            f"{block.name}: only this package's own commands run from a doc; mark the block with "
            f"`<!-- not run: REASON -->` for {unsafe}"
        )
    elif block.marker is None:
        assert block.language in PARSERS, (
            f"{block.name}: a {block.language or 'plain'} block cannot be run: run it as python or shell, or mark "
            "it with `<!-- not run: REASON -->` or `<!-- output: WHAT PRINTS IT -->` directly above its fence"
        )
        PARSERS[block.language](block.source)


def test_the_blocks_are_found() -> None:
    """A parser that found no block would pass every page."""
    assert len(BLOCKS) > 50
    assert {"python", "bash", "console", "json"} <= {block.language for block in BLOCKS}
    assert all(block.source.strip() for block in BLOCKS), [block.name for block in BLOCKS if not block.source.strip()]


def test_a_marker_is_read_only_directly_above_a_fence_and_a_bare_one_has_no_reason(tmp_path: Path) -> None:
    page = "text\n<!-- not run: needs a cluster -->\n```bash\nsrun x\n```\n\n<!-- not run -->\n\n```python\nx\n```\n"
    (tmp_path / "page.md").write_text(page)
    found = blocks_of(tmp_path / "page.md", root=tmp_path)
    assert [(block.line, block.language, block.marker, block.reason) for block in found] == [
        (3, "bash", "not run", "needs a cluster"),
        (9, "python", None, ""),
    ]
    bare = MARKER.match("<!-- not run -->")
    assert bare is not None and (bare["kind"], bare["reason"]) == ("not run", "")


def test_a_fragment_s_imports_of_the_package_are_checked_without_importing_its_framework() -> None:
    check_imports("from stateful_sampler.lightning import SamplerCheckpoint\nimport stateful_sampler.stream\nx = y")
    with pytest.raises(ImportError, match="cannot import load_everything from 'stateful_sampler.plugins'"):
        check_imports("from stateful_sampler.plugins import install, load_everything")
    with pytest.raises(ImportError, match="No module named 'stateful_sampler.streams'"):
        check_imports("from stateful_sampler.streams import ShardedStream")


def test_a_console_block_pairs_each_command_with_the_lines_under_it() -> None:
    source = "$ stateful-sampler --version\nstateful-sampler 1\n$ stateful-sampler audit --help\nusage: ...\n"
    assert shell_commands("console", source) == [
        ("stateful-sampler --version", "stateful-sampler 1"),
        ("stateful-sampler audit --help", "usage: ..."),
    ]
    assert shell_commands("bash", "# set up\nmake demo \\\n  --fast   # the demo\n") == [
        ("make demo    --fast   # the demo", "")
    ]
