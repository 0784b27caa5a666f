"""tools/bench/bench_gemm.py's correctness guard: the relative error of a call's output, and the
absolute one where the reference is all zeros (an all-zero quantized weight), instead of a
division by ~0."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_gemm():
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_gemm", ROOT / "tools" / "bench" / "bench_gemm.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_gemm"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_gemm", None)
        sys.path.remove(str(ROOT / "tools" / "bench"))


def test_relative_error_of_a_nonzero_reference(bench_gemm):
    ref = torch.tensor([[2.0, -4.0], [1.0, 0.5]], dtype=torch.bfloat16)
    out = torch.tensor([[2.0, -3.0], [1.0, 0.5]], dtype=torch.bfloat16)
    relerr, zero_ref = bench_gemm.output_error(out, ref)
    assert relerr == pytest.approx(0.25) and zero_ref is None


def test_all_zero_reference_gives_the_absolute_error(bench_gemm):
    ref = torch.zeros(3, 5, dtype=torch.bfloat16)
    out = torch.zeros(3, 5, dtype=torch.bfloat16)
    out[1, 2] = -3.7e-5
    relerr, zero_ref = bench_gemm.output_error(out, ref)
    assert relerr is None
    assert zero_ref == pytest.approx(3.7e-5, rel=1e-2)


def test_the_row_says_so_instead_of_a_huge_relerr(bench_gemm, capsys):
    row = {"m": 1, "n": 8, "k": 8, "fmt": "int1:g128", "impl": "humming_aot", "us": 7.4, "tflops": 0.1,
           "gbps": 1.0, "mode": "graph", "relerr": None, "zero_reference_abs_err": 3.7e-5}
    bench_gemm.print_row(row, None)
    line = capsys.readouterr().out
    assert "all-zero weight (no relerr): max |out| 3.7e-05" in line and "relerr above" not in line


def test_shape_sets_name_real_layers_and_reject_unknown_names(bench_gemm):
    args = bench_gemm.parse_args(["--shape-set", "llama3-8b,anchor"])
    assert args.shapes == "6144x4096,4096x4096,28672x4096,4096x14336,8192x8192"
    every = bench_gemm.parse_args(["--shape-set", "large-m"]).shapes.split(",")
    assert len(every) == len(set(every)) and "7168x18432" in every and "8192x29568" in every
    with pytest.raises(SystemExit):
        bench_gemm.parse_args(["--shape-set", "llama9"])


def test_the_json_is_written_after_every_shape_and_says_when_it_is_complete(bench_gemm, tmp_path):
    """A run cut short by a time limit keeps the points of the shapes it finished: the JSON is
    written after each shape with complete false and the shapes done, complete once every shape
    of --shapes is done; the share of the measured read bandwidth is filled in, or null without a
    bandwidth figure."""
    path = tmp_path / "out" / "bench.json"
    args = {"m": "1", "shapes": "64x64,128x64"}
    rows = [{"impl": "humming_aot", "m": 1, "n": 64, "k": 64, "us": 2.0, "gbps": 500.0}]
    bench_gemm._write_json(str(path), {"device": "d"}, 2000.0, args, rows, [], [[64, 64]])
    first = json.loads(path.read_text())
    assert first["complete"] is False and first["results"][0]["pct_read_bw"] == 25.0 and first["device"] == "d"
    assert first["shapes_done"] == [[64, 64]]
    rows.append({"impl": "humming", "m": 1, "n": 128, "k": 64, "us": float("nan"), "gbps": 400.0})
    bench_gemm._write_json(str(path), {"device": "d"}, None, args, rows, [], [[64, 64], [128, 64]])
    last = json.loads(path.read_text())
    assert last["complete"] is True and len(last["results"]) == 2
    assert last["results"][1]["us"] is None and last["results"][0]["pct_read_bw"] is None


def test_resume_keeps_the_finished_shapes_of_the_same_run_only(bench_gemm, tmp_path):
    """--resume: the points of the shapes the earlier run finished come back (not those of a shape
    it was cut short in), and nothing where the file does not exist yet; a file written on
    another device, or with other formats, M or implementations, is refused with what differs;
    --resume without --json is an argument error."""
    from humming_aot.testing.bench import resume_run

    path = tmp_path / "bench.json"
    args = vars(bench_gemm.parse_args(["--shapes", "64x64,128x64,256x64", "--m", "1,8", "--formats", "int4:g128"]))
    assert resume_run(path, args, "H200") == ([], [], [])
    rows = [{"impl": "humming_aot", "m": m, "n": n, "k": 64, "us": 2.0, "gbps": 5.0} for n in (64, 128) for m in (1, 8)]
    missing = [{"impl": "humming", "fmt": "int4:g128", "n": 64, "k": 64, "reason": "n/a"}]
    bench_gemm._write_json(str(path), {"device": "H200"}, None, args, rows[:3], missing, [[64, 64]])
    results, unavailable, done = resume_run(path, {**args, "shapes": "64x64,128x64,256x64,512x64"}, "H200")
    assert done == [[64, 64]] and unavailable == missing
    assert [(r["n"], r["m"]) for r in results] == [(64, 1), (64, 8)]  # 128 x 64 was cut short: run again
    with pytest.raises(ValueError, match="written on 'H200', this is 'H100'"):
        resume_run(path, args, "H100")
    with pytest.raises(ValueError, match="other m, formats"):
        resume_run(path, {**args, "formats": "mxfp4", "m": "1"}, "H200")
    with pytest.raises(SystemExit):
        bench_gemm.parse_args(["--resume"])


def test_codes_choose_what_humming_aot_reads_and_what_humming_quantizes(bench_gemm):
    """--codes every (default): humming_aot reads codes drawn over every code, Humming the float
    weight; quantized: humming_aot.quantize's own codes; shared: Humming gets humming_aot's
    dequantized weight (the exact operand), so both read the same codes."""
    import humming_aot

    assert bench_gemm.parse_args([]).codes == "every"
    with pytest.raises(SystemExit):
        bench_gemm.parse_args(["--codes", "some"])
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.02
    every = bench_gemm.prepare_humming_aot(w, "int4:g128", torch.bfloat16, 1, None)
    own = bench_gemm.prepare_humming_aot(w, "int4:g128", torch.bfloat16, 1, None, every_code=False)
    quantized = humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16)
    assert torch.equal(own.reference_weight, quantized.effective_weight().to(torch.bfloat16))
    assert not torch.equal(every.reference_weight, own.reference_weight)
    assert bench_gemm.humming_input(w, every, "every") is w and bench_gemm.humming_input(w, None, "shared") is w
    assert torch.equal(bench_gemm.humming_input(w, every, "shared"), every.reference_weight.float())


def test_what_runs_in_front_of_each_timed_call():
    """testing.bench.with_front: `chain` times the calls as they are; `torch` puts a torch kernel
    before each (where there is a GPU: the wrapped calls return what theirs do, in order);
    another name is refused with the choices."""
    from humming_aot.testing import bench

    order = []
    fns = [lambda i=i: order.append(i) or i for i in range(3)]
    assert bench.with_front(fns, "chain") == fns
    with pytest.raises(ValueError, match="chain, torch"):
        bench.with_front(fns, "norm")
    if torch.cuda.is_available():
        fronted = bench.with_front(fns, "torch")
        assert [f() for f in fronted] == [0, 1, 2] and order == [0, 1, 2]


def test_quant_split_sets_the_rule_for_the_process_and_rejects_bad_values(monkeypatch):
    """testing.bench.apply_quant_split (the W4A8 / W8A8 benches' --quant-split): None keeps
    cuda_quant's rule, "MIN_PARTS,SPLIT_CTAS" replaces it (so that row_parts splits by it), and
    anything but two positive ints is a ValueError naming the expected form."""
    from humming_aot.quant import cuda_quant
    from humming_aot.testing import bench

    monkeypatch.setattr(cuda_quant, "MIN_PARTS", cuda_quant.MIN_PARTS)
    monkeypatch.setattr(cuda_quant, "SPLIT_CTAS", cuda_quant.SPLIT_CTAS)
    assert bench.apply_quant_split(None) == (cuda_quant.MIN_PARTS, cuda_quant.SPLIT_CTAS)
    whole = cuda_quant.row_parts(16, 28672 // 8, 132)
    assert bench.apply_quant_split("2,256") == (2, 256)
    assert cuda_quant.row_parts(16, 28672 // 8, 132) > whole  # 16 long rows now split
    for bad in ("4", "4,x", "0,32", "4,32,1"):
        with pytest.raises(ValueError, match="MIN_PARTS,SPLIT_CTAS|at least 1"):
            bench.apply_quant_split(bad)
