"""tests/conftest.py's --part I/N (tools/device_check.sh's DEVICE_TEST_PART): N contiguous slices
of the selected tests that together are exactly the selection, and a clear error for a bad value."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests/unit/test_heuristics.py"


def _collect(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", TARGET, "--co", "-q", "-p", "no:cacheprovider", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def _ids(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_parts_are_contiguous_slices_that_cover_the_selection_once():
    everything = _ids(_collect())
    assert len(everything) >= 3
    first, second = _ids(_collect("--part", "1/2")), _ids(_collect("--part", "2/2"))
    assert len(first) == len(everything) // 2 and first + second == everything
    # the slices are taken after every other selection: of what -k kept
    kept = [node for node in everything if "tokens" in node.split("::")[-1]]
    assert 1 < len(kept) < len(everything)
    assert _ids(_collect("-k", "tokens", "--part", "2/2")) == kept[len(kept) // 2:]


def test_a_bad_part_is_a_usage_error_that_shows_the_form():
    result = _collect("--part", "3/2")
    assert result.returncode != 0
    assert "expected I/N with 1 <= I <= N" in result.stdout + result.stderr
