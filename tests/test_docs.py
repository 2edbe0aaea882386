"""The documentation site builds strictly (a broken link, a missing page or API entry fails),
and the README stays a short front door."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_site_builds_strictly(tmp_path):
    if shutil.which("mkdocs") is None and not os.path.exists(
            os.path.join(os.path.dirname(sys.executable), "mkdocs")):
        pytest.skip("the docs extra is absent: pip install -e '.[docs]'")
    mkdocs = shutil.which("mkdocs") or os.path.join(os.path.dirname(sys.executable), "mkdocs")
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    page = (tmp_path / "site" / "configuration" / "index.html").read_text()
    # The hook replaced its marker by the table of keys (the heading's anchor keeps the name).
    assert "method.caco.bank_size" in page and "<!-- configuration-reference -->" not in page


def test_the_readme_is_short_and_keeps_its_two_commands():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert len(readme.splitlines()) <= 200
    assert ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
            "python train.py") in readme
    assert ('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && '
            "python -m pytest -q -n 2") in readme
