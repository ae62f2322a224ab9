"""Runs one doc page's code blocks in order, in this process, in the current (fresh, temporary) directory:
``python run_page.py BLOCKS.json RESULTS.json``. tests/docs/test_code_blocks.py writes the blocks and reads
one result a block, ``{"error": None}`` or the traceback or the difference in output.

The python blocks of a page share one namespace, as a reader who pastes them one after another into one
interpreter; a shell block runs in bash here, with this interpreter's ``bin/`` first on ``PATH``, so that
``python`` and ``stateful-sampler`` are the ones under test (a plain ``stateful-sampler`` command runs in this
process, through the function its entry point calls). A block after a failed python block is not run:
it would fail for its predecessor's reason."""

from __future__ import annotations

import ast
import contextlib
import doctest
import importlib.util
import io
import json
import os
import pkgutil
import re
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

SHELL_TIMEOUT = 60  # seconds a shell command may take: the ones that run are --help and small audits
SHELL_SYNTAX = re.compile(r"[|&;<>()$`*?]")  # pipes, redirections, substitutions, globs: bash's to run


def top_level_names(module: str) -> set[str]:
    """The names a module of this package defines or imports at its top level, read from its source, so that a
    fragment's imports are checked without importing a framework (lightning, accelerate) it needs."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"No module named {module!r}")
    names: set[str] = set()
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name))
            is_all = any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets)
            if is_all and isinstance(node.value, ast.List | ast.Tuple):  # a lazy module's names
                names.update(item.value for item in node.value.elts if isinstance(item, ast.Constant))
    if spec.submodule_search_locations:  # a package: its submodules are importable names too
        names.update(info.name for info in pkgutil.iter_modules(spec.submodule_search_locations))
    return names


def check_imports(source: str) -> None:
    """The fragment's imports of this package resolve: each module exists and defines each name it imports."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "stateful_sampler":
            missing = [alias.name for alias in node.names if alias.name not in top_level_names(node.module or "")]
            if missing:
                raise ImportError(f"cannot import {', '.join(missing)} from {node.module!r}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "stateful_sampler" and importlib.util.find_spec(alias.name) is None:
                    raise ImportError(f"No module named {alias.name!r}")


def run_python(block: dict, namespace: dict) -> None:
    code = compile(block["source"], block["name"], "exec")
    if block["run"]:
        exec(code, namespace)  # noqa: S102  # the page's own example, as a reader runs it
    else:
        check_imports(block["source"])


def shell_commands(language: str, source: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs: a console block's ``$ `` lines and the lines under each, or every
    line of a bash block (continuations joined), expecting nothing in particular."""
    lines = source.splitlines()
    if language != "console":
        joined = "\n".join(lines).replace("\\\n", " ").splitlines()
        return [(command, "") for command in joined if command.strip() and not command.lstrip().startswith("#")]
    pairs: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs:
            pairs[-1][1].append(line)
    return [(command, "\n".join(output)) for command, output in pairs]


def run_command(command: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr). ``stateful-sampler ARGS`` without shell syntax runs here, through the
    entry point's own ``stateful_sampler.cli.main`` (no second interpreter to start); the rest in bash."""
    words = shlex.split(command, comments=True)
    if words[0] == "stateful-sampler" and not SHELL_SYNTAX.search(command.split("#")[0]):
        from stateful_sampler.cli import main as cli_main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli_main(words[1:])
            except SystemExit as exit_:  # --help, --version and argparse's errors exit
                code = exit_.code if isinstance(exit_.code, int) else 1
        return code, out.getvalue(), err.getvalue()
    environment = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=SHELL_TIMEOUT, env=environment, check=False
    )
    return done.returncode, done.stdout, done.stderr


def run_shell(block: dict) -> str | None:
    checker = doctest.OutputChecker()
    options = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for command, expected in shell_commands(block["language"], block["source"]):
        code, stdout, stderr = run_command(command)
        if code != 0:
            return f"`{command}` exited {code}:\n{stdout}{stderr}"
        want = expected.replace("…", "...") + "\n" if expected.strip() else ""
        if want and not checker.check_output(want, stdout, options):
            return f"`{command}` printed other output than the block shows:\n" + checker.output_difference(
                doctest.Example(command, want), stdout, options
            )
    return None


def main(blocks_path: str, results_path: str) -> None:
    blocks = json.loads(Path(blocks_path).read_text())
    namespace: dict = {"__name__": "__main__"}
    results = []
    failed = None
    for block in blocks:
        if failed is not None and block["run"] and block["language"] == "python":
            results.append({"error": f"not run: the block at {failed} before it failed"})
            continue
        try:
            if block["language"] == "python":
                run_python(block, namespace)
                error = None
            else:
                error = run_shell(block)
        except BaseException:  # noqa: BLE001  # a SystemExit or KeyboardInterrupt of a block is its failure too
            error = traceback.format_exc()
        if error is not None and block["language"] == "python" and block["run"]:
            failed = block["name"]
        results.append({"error": error})
    Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
