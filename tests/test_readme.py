"""The README's Python examples run as written (those on Ray under the ``ray`` marker)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _uses_ray(block: str) -> bool:
    return 'backend="ray"' in block


def test_readme_python_examples_run():
    blocks = [b for b in _blocks() if not _uses_ray(b)]
    assert len(blocks) >= 2
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["master"].params().abs().sum() > 0


@pytest.mark.ray
def test_readme_ray_examples_run():
    pytest.importorskip("ray", reason="needs Ray: pip install 'ray>=2.9'")
    blocks = [b for b in _blocks() if _uses_ray(b)]
    assert blocks
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
        result = namespace["result"]
        assert result.backend == "ray" and result.summary["final_test_error"] < 0.2


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    commands = re.findall(r"^    (bash scripts/setup.sh && .+)$", text, flags=re.M)
    assert len(commands) == 2
    assert commands[1].endswith("python -m pytest -q")
    assert "python -m pytest -q" in (README.parents[0] / ".ci" / "run").read_text()
