"""Every ``python`` example in the docs runs, page by page, against a private Redis.

The blocks of one page run in order in one namespace, like a tutorial, in a fresh
process per page (so pages never see each other's apps, records or environment).
Top-level ``await`` and ``async with`` work: such a block is compiled with
``PyCF_ALLOW_TOP_LEVEL_AWAIT`` and awaited in ``trio.run``; other blocks run as
plain code (so ``trio.run(main)`` in a block works too). Tracebacks name the page
and its real line numbers.

Examples that cannot run on their own (workers that run forever, Spark jobs) are
``{literalinclude}`` s of files under ``examples/`` that other tests run. The only
escape hatch is a ``% docs-test: skip <reason>`` comment right before a block.

Run one page by hand with ``python tests/test_docs.py docs/locks.md``.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import traceback
import types
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import trio

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGE_TIMEOUT = 25.0
MAX_SKIPS = 3

FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>\S*)")
SKIP = re.compile(r"^%\s*docs-test:\s*skip\b\s*(?P<reason>.*)$")
INCLUDE = re.compile(r"^`{3,}\{literalinclude\}\s+(?P<path>\S+)")


class Block(NamedTuple):
    """One fenced code block of a page: its first code line (1-based) and source."""

    line: int
    language: str
    source: str
    skip_reason: str | None


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks (any language), with skip markers."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        fence, info = match["fence"], match["info"]
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        skip = SKIP.match(previous.strip())
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        source = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(index + 2, info, source, skip["reason"].strip() if skip else None))
        index = end + 1
    return found


def python_blocks(page: Path) -> list[Block]:
    return [block for block in blocks(page) if block.language in ("python", "py", "python3")]


# -- the runner, in the page's own process --


def run_page(page: Path) -> None:
    """Run the page's python blocks in order in one namespace; raise on the first failure."""
    # A real module, so that type hints of records defined on the page resolve.
    module = types.ModuleType(f"docs_{page.stem}")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
    for block in python_blocks(page):
        if block.skip_reason is not None:
            continue
        # Pad with blank lines so that tracebacks show the page's own line numbers.
        source = "\n" * (block.line - 1) + block.source
        code = compile(source, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        try:
            if code.co_flags & inspect.CO_COROUTINE:
                # Top-level await: evaluating the block gives a coroutine to await.
                coroutine = eval(code, namespace)

                async def wait(coroutine: Any = coroutine) -> None:
                    await coroutine

                trio.run(wait)
            else:
                exec(code, namespace)
        except BaseException:
            print(f"{name}:{block.line}: this block failed:", file=sys.stderr)
            traceback.print_exc()
            raise SystemExit(1) from None


# -- the tests --


@pytest.mark.timeout(PAGE_TIMEOUT + 15)
@pytest.mark.parametrize("page", [p for p in pages() if python_blocks(p)], ids=lambda p: p.stem)
async def test_page_examples_run(page: Path, redis_url: str) -> None:
    # Only the private server: no STREAMKIT_* setting of the caller leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    env["STREAMKIT_REDIS_URL"] = redis_url
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with trio.fail_after(PAGE_TIMEOUT):
        result = await trio.run_process(
            [sys.executable, __file__, str(page)],
            cwd=ROOT,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, (
        f"an example of {page.name} failed:\n{result.stderr.decode()}\n"
        f"stdout:\n{result.stdout.decode()}"
    )


def test_skips_are_few_and_explained() -> None:
    skipped = [
        (page.name, block.line, block.skip_reason)
        for page in pages()
        for block in python_blocks(page)
        if block.skip_reason is not None
    ]
    for page_name, line, reason in skipped:
        assert len(reason or "") >= 10, f"{page_name}:{line}: a skip needs a reason"
    assert len(skipped) <= MAX_SKIPS, skipped


def test_python_blocks_are_found() -> None:
    found = {page.stem: len(python_blocks(page)) for page in pages()}
    # The quickstart's steps are shell blocks: tests/test_quickstart.py runs them.
    assert found["streams"] >= 1
    assert found["locks"] >= 1
    # No python hides in other fence spellings the test would not run.
    for page in pages():
        for block in blocks(page):
            assert block.language not in ("{code-block}", "{code}", "pycon"), (page, block.line)


def test_included_examples_are_tested() -> None:
    """Every example a page includes is run by some test."""
    tests = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py"))
    for page in pages():
        for line in page.read_text(encoding="utf-8").splitlines():
            match = INCLUDE.match(line)
            if match is None:
                continue
            path = (DOCS / match["path"]).resolve()
            assert path.is_file(), f"{page.name}: {match['path']} does not exist"
            assert path.is_relative_to(ROOT / "examples"), f"{page.name}: include {path}"
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            assert path.name in tests or module in tests, f"no test runs {path}"


if __name__ == "__main__":
    run_page(Path(sys.argv[1]).resolve())
