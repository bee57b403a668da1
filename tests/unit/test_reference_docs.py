"""The generated reference pages (docs/reference/cli.md, metrics.md) match the code."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_committed_reference_pages_match_the_parser_and_the_metric_families():
    done = subprocess.run([sys.executable, str(REPO / "tools" / "reference_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_check_names_a_page_that_differs(tmp_path):
    # A copy of the generator beside a stale page: the check must fail and name it.
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "reference_docs.py").write_text((REPO / "tools" / "reference_docs.py").read_text())
    (tmp_path / "service").symlink_to(REPO / "service")
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    (tmp_path / "docs" / "reference" / "cli.md").write_text("stale\n")
    done = subprocess.run([sys.executable, str(tmp_path / "tools" / "reference_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "docs/reference/cli.md differs" in done.stderr
    assert "docs/reference/metrics.md differs" in done.stderr  # absent counts as differing
