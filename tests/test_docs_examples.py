"""The README and docs/USAGE.md as written: their Python examples run (those on Ray under
the ``ray`` marker), their links resolve, and the README opens with the two commands."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "USAGE.md"
#: The pages whose ``python`` code blocks are examples to run.
PAGES = [README, USAGE]


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def _uses_ray(block: str) -> bool:
    return 'backend="ray"' in block


def _run(block: str, page: Path) -> dict:
    namespace: dict = {}
    exec(compile(block, str(page), "exec"), namespace)
    return namespace


def test_readme_shows_the_two_python_examples_and_points_to_dana_optim():
    blocks = [b for b in _blocks(README) if not _uses_ray(b)]
    assert len(blocks) == 2
    assert "dana.simulate(" in blocks[0] and "dana.fit(" in blocks[1]
    assert "docs/USAGE.md#dana-in-your-own-loop-danaoptim" in README.read_text()
    assert any("dana.optim.Worker(" in b for b in _blocks(USAGE))


def test_readme_shows_the_language_model_preset_and_the_install():
    text = README.read_text()
    assert "dana sweep --preset text-quick --out" in text  # the fortunes: no --data-dir
    install = text[text.index("## Install") :]
    assert install.index('pip install ".[ray,mlflow]"') < install.index("scripts/setup.sh")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_examples_run(page):
    blocks = [b for b in _blocks(page) if not _uses_ray(b)]
    assert blocks
    for block in blocks:
        namespace = _run(block, page)
        if "master" in namespace:  # the rules driven by hand
            assert namespace["master"].params().abs().sum() > 0


@pytest.mark.ray
def test_ray_examples_run(local_ray):
    """On the session's local Ray (one Ray start fewer), which the examples find and use."""
    blocks = [(b, page) for page in PAGES for b in _blocks(page) if _uses_ray(b)]
    assert blocks
    for block, page in blocks:
        result = _run(block, page)["result"]
        assert result.backend == "ray" and result.summary["final_test_error"] < 0.2


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    commands = re.findall(r"^    (bash scripts/setup.sh && .+)$", text, flags=re.M)
    assert len(commands) == 2
    assert commands[1].endswith("python -m pytest -q")
    assert "python -m pytest -q" in (README.parents[0] / ".ci" / "run").read_text()
    assert '    python -m pytest -q -m "not ray and not slow"' in text.splitlines()
