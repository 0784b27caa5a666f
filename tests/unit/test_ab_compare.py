"""tools/bench/ab_compare.py: the side-by-side table of an A/B run (tools/device_check.sh, step ab),
from synthetic bench_gemm.py outputs, and tools/ab_base.sh's base tree."""
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ab_compare", ROOT / "tools" / "bench" / "ab_compare.py")
ab_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_compare)


def _run(times: dict) -> dict:
    """A bench_gemm.py JSON with one result per (fmt, m) -> us."""
    return {"results": [{"impl": "humming_aot", "fmt": fmt, "m": m, "n": 8192, "k": 8192, "us": us}
                        for (fmt, m), us in times.items()]}


def test_rows_are_medians_over_rounds_with_change_and_spread(tmp_path):
    base = [_run({("int1:g128", 1): 8.8, ("int4:g128", 1): 11.1}), _run({("int1:g128", 1): 8.7, ("int4:g128", 1): 11.3}),
            _run({("int1:g128", 1): 9.0, ("int4:g128", 1): 11.2})]
    current = [_run({("int1:g128", 1): 8.3, ("int4:g128", 1): 11.0, ("int2:g128", 1): 9.1}),
               _run({("int1:g128", 1): 8.2, ("int4:g128", 1): 11.2, ("int2:g128", 1): 9.0}),
               _run({("int1:g128", 1): 8.4, ("int4:g128", 1): 11.1, ("int2:g128", 1): 9.2})]
    files = []
    for side, runs in (("base", base), ("current", current)):
        for i, run in enumerate(runs):
            path = tmp_path / f"{side}_{i}.json"
            path.write_text(json.dumps(run))
            files.append(path)
    out = tmp_path / "ab.json"
    assert ab_compare.main([str(out), "--merge", "--rev", "abc123", "--base", *map(str, files[:3]),
                            "--current", *map(str, files[3:])]) == 0
    ab = json.loads(out.read_text())
    assert ab["base"]["rev"] == "abc123" and len(ab["current"]["rounds"]) == 3
    rows = {r["fmt"]: r for r in ab_compare.compare(ab)}
    assert set(rows) == {"int1:g128", "int4:g128"}  # int2 was measured on one side only
    assert rows["int1:g128"]["base_us"] == pytest.approx(8.8) and rows["int1:g128"]["current_us"] == pytest.approx(8.3)
    assert rows["int1:g128"]["delta_us"] == pytest.approx(-0.5)
    assert rows["int1:g128"]["delta_pct"] == pytest.approx(-50 / 8.8)
    assert rows["int1:g128"]["spread_us"] == pytest.approx(9.0 - 8.2)
    assert rows["int4:g128"]["delta_us"] == pytest.approx(11.1 - 11.2)
    table = ab_compare.format_table(ab)
    assert "base abc123" in table and "-0.50" in table
    assert "measured on one side only: ('humming_aot', 'int2:g128', 1, 8192, 8192)" in table


def test_merge_without_rounds_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit):
        ab_compare.main([str(tmp_path / "ab.json"), "--merge", "--base"])


def _clone_with_ab_base(tmp_path):
    """(clone of this checkout, its tools/ab_base.sh in this checkout's version, the clone's HEAD)."""
    if not (ROOT / ".git").exists():
        pytest.fail("tools/ab_base.sh needs the git checkout (run the tests from a clone)")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    script = clone / "tools" / "ab_base.sh"
    script.write_bytes((ROOT / "tools" / "ab_base.sh").read_bytes())
    rev = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], check=True, capture_output=True,
                         text=True).stdout.strip()
    return clone, script, rev


def test_ab_base_writes_the_tree_of_a_revision(tmp_path):
    clone, script, rev = _clone_with_ab_base(tmp_path)
    subprocess.run(["bash", str(script), "HEAD"], check=True, cwd=clone, capture_output=True)
    base = clone / ".ab" / "base"
    assert (base / ".ab_rev").read_text().strip() == rev
    tracked = subprocess.run(["git", "-C", str(clone), "ls-tree", "-r", "--name-only", rev], check=True,
                             capture_output=True, text=True).stdout.split()
    assert tracked and all((base / name).exists() for name in tracked)
    (clone / ".gitignore").write_bytes((ROOT / ".gitignore").read_bytes())
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain", "--untracked-files=all"], check=True,
                            capture_output=True, text=True).stdout
    assert ".ab/" not in status  # ignored: never committed
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run(["bash", str(script), "no-such-rev"], check=True, cwd=clone, capture_output=True)


def test_ab_base_writes_a_second_base_under_ab_only(tmp_path):
    clone, script, rev = _clone_with_ab_base(tmp_path)
    subprocess.run(["bash", str(script), "HEAD", ".ab/other/"], check=True, cwd=clone, capture_output=True)
    assert (clone / ".ab" / "other" / ".ab_rev").read_text().strip() == rev
    assert not (clone / ".ab" / "base").exists()
    for bad in ("elsewhere", ".ab", ".ab/../x", "/tmp/x"):
        result = subprocess.run(["bash", str(script), "HEAD", bad], cwd=clone, capture_output=True, text=True)
        assert result.returncode == 2 and "under .ab/" in result.stderr, bad
    assert not (clone / "elsewhere").exists()


def test_bench_moe_rounds_compare_per_model_gemm_and_token_count():
    """bench_moe.py's rows (tokens, model, gemm, layout, format) are points too: the same N and K
    of two models stay apart, and a point an external implementation failed (us None) is left out."""
    def moe_run(us_a: float, us_b: float) -> dict:
        row = {"impl": "humming_aot", "format": "int4:g128", "tokens": 16, "n": 7168, "k": 256, "layout": "masked"}
        return {"results": [dict(row, model="deepseek-v3-tp8", gemm="gemm2", us=us_a),
                            dict(row, model="256x8:7168x256", gemm="gemm", us=us_b),
                            dict(row, impl="humming", model="deepseek-v3-tp8", gemm="gemm2", us=None)]}

    ab = {"base": {"rev": "a", "rounds": [moe_run(72.0, 73.0), moe_run(74.0, 75.0)]},
          "current": {"rev": "b", "rounds": [moe_run(60.0, 61.0), moe_run(62.0, 63.0)]}}
    rows = {r["impl"]: r for r in ab_compare.compare(ab)}
    assert set(rows) == {"humming_aot deepseek-v3-tp8 gemm2 masked", "humming_aot 256x8:7168x256 gemm masked"}
    first = rows["humming_aot deepseek-v3-tp8 gemm2 masked"]
    assert (first["fmt"], first["m"], first["n"], first["k"]) == ("int4:g128", 16, 7168, 256)
    assert first["base_us"] == pytest.approx(73.0) and first["current_us"] == pytest.approx(61.0)


def test_w8a8_and_w4a8_rounds_compare_per_pairing():
    """bench_w8a8.py's and bench_w4a8.py's rows carry no format: their pairing (current_table.py's
    row_format) stands in for it, so a float8 and an int8 point of one shape stay apart."""
    def run(fp8: float, int8: float, w4: float) -> dict:
        row = {"impl": "humming_aot", "m": 128, "n": 6144, "k": 4096}
        return {"results": [dict(row, us=fp8), dict(row, int8=True, us=int8), dict(row, w4a8=True, us=w4)]}

    ab = {"base": {"rev": "a", "rounds": [run(12.4, 12.0, 15.4), run(12.6, 12.2, 15.6)]},
          "current": {"rev": "b", "rounds": [run(11.9, 12.1, 14.8), run(12.1, 12.3, 15.0)]}}
    rows = {r["fmt"]: r for r in ab_compare.compare(ab)}
    assert set(rows) == {"W8A8 float8e4m3:channel x float8e4m3:token", "W8A8 int8:channel x int8:token",
                         "W4A8 int4:g128 x float8e4m3:token"}
    w4 = rows["W4A8 int4:g128 x float8e4m3:token"]
    assert w4["base_us"] == pytest.approx(15.5) and w4["current_us"] == pytest.approx(14.9)
    assert "W4A8 int4:g128" in ab_compare.format_table(ab)
