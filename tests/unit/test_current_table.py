"""tools/bench/current_table.py: the generated table of current figures, from synthetic
bench_gemm.py results (ours, Humming, cuBLAS), with its per-format summary."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("current_table", ROOT / "tools" / "bench" / "current_table.py")
current_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(current_table)


def _point(impl, fmt, m, us, n=4096, k=4096):
    return (impl, fmt, n, k, m), us


def test_cells_and_summary_come_from_the_points():
    points = dict([
        _point("humming_aot", "int4:g128", 32, 10.0), _point("humming", "int4:g128", 32, 12.0),
        _point("torch_bf16", "bfloat16", 32, 15.0),
        _point("humming_aot", "int4:g128", 64, 20.0), _point("humming", "int4:g128", 64, 15.0),
    ])
    text = current_table.table(points, ["a.json", "b.json"], "NVIDIA H200")
    assert "`a.json`, `b.json` (NVIDIA H200" in text
    assert "| 4096 x 4096 | 10.0 / 12.0 / 15.0 | 20.0 / 15.0 / - |" in text
    # 1.2x and 0.75x: geometric mean sqrt(0.9) = 0.95, one point below 0.95x, one at or above 1.0x
    assert "geometric mean 0.95x its speed over 2 points; 1 below 0.95x, 1 at or above 1.0x" in text


def test_a_shape_without_our_point_shows_a_dash():
    points = dict([_point("humming_aot", "int8:channel", 32, 5.0, n=8192),
                   _point("humming_aot", "int8:channel", 64, 6.0, n=4096)])
    text = current_table.table(points, ["x.json"], "dev")
    assert "| 4096 x 4096 | - | 6.0 / - / - |" in text and "Against Humming" not in text


def test_w8a8_rows_get_their_pairing_and_their_cublas_column(tmp_path):
    import json

    rows = [dict(impl="humming_aot", n=4096, k=4096, m=16, us=10.0, blocks=False, int8=True),
            dict(impl="int_mm", n=4096, k=4096, m=16, us=20.0, blocks=False, int8=True),
            dict(impl="humming", n=4096, k=4096, m=16, us=12.0, blocks=False, int8=True),
            dict(impl="humming_aot", n=4096, k=4096, m=16, us=8.0, blocks=True),
            dict(impl="humming", n=4096, k=4096, m=16, us=4.0, blocks=True),
            dict(impl="humming_aot", fmt="int4:g128", n=4096, k=4096, m=16, us=5.0)]
    path = tmp_path / "session.json"
    path.write_text(json.dumps({"device": "dev", "runs": {"a": {"results": rows[:3]}, "b": {"results": rows[3:]}}}))
    payloads = [current_table.load(f"{path}:a"), current_table.load(f"{path}:b")]
    text = current_table.table(current_table.merge(payloads), ["s:a", "s:b"], "dev", note="A note.")
    assert "A note." in text
    # 16-bit formats first, then the W8A8 pairings, each with its own baseline column (none for blocks)
    assert text.index("## int4:g128") < text.index("## W8A8 float8e4m3:b128x128")
    assert "## W8A8 int8:channel x int8:token: ours / Humming / torch._int_mm + scales" in text
    assert "| 4096 x 4096 | 10.0 / 12.0 / 20.0 |" in text and "| 4096 x 4096 | 8.0 / 4.0 |" in text
    assert "Against torch._int_mm + scales: geometric mean 2.00x its speed over 1 points" in text
    assert "Against Humming: geometric mean 0.50x its speed over 1 points; 1 below 0.95x" in text


def test_w4a8_rows_get_their_pairing_and_our_w4a16_column():
    rows = [dict(impl="humming_aot", n=8192, k=8192, m=4096, us=600.0, w4a8=True),
            dict(impl="w4a16", n=8192, k=8192, m=4096, us=780.0, w4a8=True),
            dict(impl="humming", n=8192, k=8192, m=4096, us=590.0, w4a8=True)]
    text = current_table.table(current_table.merge([{"results": rows}]), ["s"], "dev")
    assert "## W4A8 int4:g128 x float8e4m3:token: ours / Humming / our W4A16 (bf16 activations)" in text
    assert "| 8192 x 8192 | 600.0 / 590.0 / 780.0 |" in text
    assert "Against our W4A16 (bf16 activations): geometric mean 1.30x its speed over 1 points" in text


def test_moe_rows_make_a_table_per_format_and_routing_with_the_grouped_mm_column():
    base = dict(model="qwen3-30b-a3b", gemm="gemm2", layout="contiguous", n=2048, k=768, experts=128, top_k=8,
                format="int4:g128")
    rows = [dict(base, impl="humming_aot", tokens=64, us=40.0, note=""),
            dict(base, impl="humming_aot", tokens=64, us=30.0, note="tile wgmma-ws:16x256x64_w1x4_s6"),  # a sweep
            dict(base, impl="humming_aot", tokens=64, us=31.0, note="splits 2"),
            dict(base, impl="humming", tokens=64, us=44.0, note="first call (JIT) 20 s"),
            dict(base, impl="torch_grouped_mm", tokens=64, us=120.0, note="bf16 weights"),
            dict(base, impl="humming_aot_loop", tokens=64, us=400.0, note=""),
            dict(base, impl="humming_aot", tokens=256, us=50.0, note=""),
            dict(impl="humming_aot", fmt="int4:g128", n=4096, k=4096, m=16, us=5.0)]
    text = current_table.table(current_table.merge([{"results": rows}]), ["moe.json"], "dev")
    title = "## MoE int4:g128, contiguous, 128 experts, top-8: ours / Humming / torch._grouped_mm bf16"
    assert text.index("## int4:g128") < text.index(title)
    # the table's tile (not the forced tile or split, nor the expert loop), by token count
    assert "| N x K | tokens = 64 | tokens = 256 |" in text and "| 2048 x 768 | 40.0 / 44.0 / 120.0 | 50.0 / - / - |" in text
    assert "Against torch._grouped_mm bf16: geometric mean 3.00x its speed over 1 points" in text
    assert "Against Humming: geometric mean 1.10x its speed over 1 points" in text
