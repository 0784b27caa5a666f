"""ops.quantize_activation's kernels (humming_aot.quant.cuda_quant) against the exact references of
humming_aot.quant.activation, bit for bit on codes and scales: int8 and fp8 elements, per token,
per group and per tensor (static and dynamic), float16 and bfloat16, odd row counts, rows of zeros,
values near the saturation and underflow edges, strided and 3-d activations, and a CUDA graph. The
reference runs on the CPU on the same values (its arithmetic is the same there)."""
from __future__ import annotations

import os

import pytest
import torch

from humming_aot import helper_kernels, ops
from humming_aot.quant import ActivationFormat, cuda_quant
from humming_aot.testing.jit import why_no_jit

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def launched(monkeypatch):
    """The quant unit loadable (from a catalog or the JIT); the symbols launched in the test (and in
    its `grids`, (symbol, grid, cluster) of each launch)."""
    monkeypatch.setenv("HUMMING_AOT_HELPERS", "1")
    if not helper_kernels.available("quant", torch.cuda.current_device()):
        pytest.skip(why_no_jit("the quant unit comes from a catalog or the JIT", "to build it")
                    or "the quant helper unit cannot be loaded here (see the warning logged)")
    unit = helper_kernels.load("quant", torch.cuda.current_device())
    symbols = _Launches()
    launch = type(unit).launch

    def spy(self, symbol, grid, threads, smem, stream, params, cluster=(1, 1, 1), *, programmatic=False):
        symbols.append(symbol)
        symbols.grids.append((symbol, tuple(grid), tuple(cluster)))
        symbols.programmatic.append(programmatic)
        return launch(self, symbol, grid, threads, smem, stream, params, cluster, programmatic=programmatic)

    monkeypatch.setattr(type(unit), "launch", spy)
    return symbols


class _Launches(list):
    def __init__(self):
        super().__init__()
        self.grids = []
        self.programmatic = []

    def clear(self):
        super().clear()
        self.grids.clear()
        self.programmatic.clear()


def _kernel(member: str, act: str, element: str, rows: int, k: int) -> tuple[str, int]:
    """(symbol, parts a row) that cuda_quant launches for rows x k on this GPU: a row split in
    parts (cuda_quant.row_parts) takes the 256-thread kernel; else up to WIDE_ROWS rows the
    1024-thread one where there is one."""
    device = torch.cuda.current_device()
    unit = helper_kernels.load("quant", device)
    parts = cuda_quant._parts(unit, rows, k, device, cluster=member == "token")
    wide = "_wide" if parts == 1 and member != "tensor_apply" and rows <= cuda_quant.WIDE_ROWS else ""
    return f"quant_{member}_{act}_{element}{wide}", parts


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _elements() -> list[str]:
    major, minor = torch.cuda.get_device_capability()
    return ["int8"] + (["float8e4m3", "float8e5m2"] if (major, minor) >= (8, 9) else [])


def _activations(rows: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random rows over six decades of magnitude, with a row of zeros (scale 1) and a half row of
    tiny values beside large ones (codes that round to zero or to subnormal fp8)."""
    x = torch.randn(rows, k, generator=gen) * torch.logspace(-3, 3, rows).unsqueeze(1)
    if rows > 2:
        x[1] = 0
        x[2, : k // 2] = 1e-6
    return x.to(dtype)


def _check(a: torch.Tensor, text: str, launched: list[str], expect_kernel: str, parts: int | None = None,
           **kwargs) -> None:
    """ops.quantize_activation bit for bit against the reference, by `expect_kernel` (in `parts`
    CTAs a row, where given: a token row's parts one cluster)."""
    got = ops.quantize_activation(a, text, **kwargs)
    cpu_kwargs = {key: (v.cpu() if isinstance(v, torch.Tensor) else v) for key, v in kwargs.items()}
    ref = ActivationFormat.parse(text).quantize(a.cpu(), **cpu_kwargs)
    assert expect_kernel in launched, f"{text}: {expect_kernel} did not run ({launched})"
    if parts is not None:
        cluster = (1, parts, 1) if "_token_" in expect_kernel else (1, 1, 1)
        want = (expect_kernel, (a.reshape(-1, a.shape[-1]).shape[0], parts, 1), cluster)
        assert want in launched.grids, f"{text}: {want} not launched ({launched.grids})"
    assert got.codes.is_cuda and got.codes.shape == ref.codes.shape and got.scales.shape == ref.scales.shape
    assert torch.equal(got.scales.cpu(), ref.scales), f"{text} {tuple(a.shape)} {a.dtype}: scales differ"
    mismatch = (got.codes.cpu() != ref.codes).nonzero()
    assert mismatch.numel() == 0, f"{text} {tuple(a.shape)} {a.dtype}: codes differ at {mismatch[:5].tolist()}"
    if ref.global_scale is not None:
        assert got.global_scale is not None and torch.equal(got.global_scale.cpu(), ref.global_scale), text


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("granularity", ["token", "g16", "g128", "g256", "tensor"])
def test_kernels_match_the_reference(launched, dtype, granularity):
    gen = torch.Generator().manual_seed(_seed())
    act = "bf16" if dtype == torch.bfloat16 else "f16"
    member = {"token": "token", "tensor": "tensor_apply"}.get(granularity, "group")
    for element in _elements():
        # up to cuda_quant.WIDE_ROWS rows the token and group recipes take the 1024-thread kernels,
        # few long rows several 256-thread CTAs a row (row_parts: on 132 SMs 1 x 28672 and 2 x 40960
        # in 8 parts, 5 x 16384 in 4, 2 x 8960 in 4 of 288, 288, 288 and 256 vectors at g128); a
        # CTA's row or part is read once up to 8,192 (256 threads) or 32,768 elements (1,024),
        # twice past that (300 x 12288; 1 x 73728 in 8 parts of 9,216; per token, 70 x 40960 in one
        # 1,024-thread CTA a row, and 4 x 65544 in 8 parts of 1,025 and 1,024 vectors, read twice
        # and once by the CTAs of one cluster)
        shapes = [(1, 256), (37, 4096), (300, 7168), (5, 16384), (128, 1024), (129, 1024), (1, 28672),
                  (300, 12288), (2, 40960), (2, 8960), (1, 73728)]
        if granularity == "token":
            shapes += [(70, 40960), (4, 65544)]
        for rows, k in shapes:
            a = _activations(rows, k, dtype, gen).cuda()
            symbol, parts = _kernel(member, act, element, rows, k)
            launched.clear()
            _check(a, f"{element}:{granularity}", launched, symbol, parts)
        if granularity == "tensor":
            assert f"quant_tensor_amax_{act}" in launched
            for given in (0.03125, torch.tensor([7.5]).cuda()):
                _check(a, f"{element}:tensor", launched, f"quant_tensor_apply_{act}_{element}", static_scale=given)


def _extremes(k: int, gen: torch.Generator) -> torch.Tensor:
    """bfloat16 rows at the ends of its range, each side of numerics/reciprocal_quotient.cuh's
    divisor range [2^-64, 2^64] (outside it the kernels divide): huge rows (scales past 2^64), tiny
    rows (scales under 2^-64), subnormals beside ones (quotients under 2^-100 on the product path),
    signed zeros beside ones, and ordinary rows."""
    base = torch.randn(8, k, generator=gen)
    rows = [base[0] * 1e30, base[1] * 1e-30, base[2] * 1e-36, base[3], base[4] * 3e-39, base[5] * 1e20,
            base[6] * 1e-16, base[7]]
    rows[3][: k // 2] = base[3][: k // 2].sign() * 2e-39  # subnormal bfloat16 beside values near 1
    rows[7][::3] = -0.0
    return torch.stack(rows).to(torch.bfloat16)


def test_extreme_magnitudes_match_the_reference(launched):
    """Codes and scales bit for bit at magnitudes where the kernels' quotient switches between the
    corrected reciprocal product and the division, and static scales whose quotients overflow
    float32 (clamped first) or lie outside the product's range."""
    gen = torch.Generator().manual_seed(_seed())
    for k in (256, 40960):  # a row of one CTA, and (on 64 or more SMs) of 8 parts of 640 vectors
        a = _extremes(k, gen).cuda()
        for element in _elements():
            for granularity in ("token", "g16", "g128", "tensor"):
                launched.clear()
                member = {"token": "token", "tensor": "tensor_apply"}.get(granularity, "group")
                _check(a, f"{element}:{granularity}", launched, *_kernel(member, "bf16", element, 8, k))
            for given in (1e-30, 1e-10, 1e25, torch.tensor([2.0**-64]).cuda(), torch.tensor([2.0**64]).cuda()):
                _check(a, f"{element}:tensor", launched, f"quant_tensor_apply_bf16_{element}", static_scale=given)
        if torch.cuda.get_device_capability() >= (8, 9):
            _check(a, "nvfp4", launched, "quant_fp4_nv_bf16")
            # divisors (block scale x global) inside [2^-64, 2^64] with quotients past float32 (the
            # clamped product), below 2^-64 and above 2^64 (divided)
            for given in (2.0**-72, 1e-25, 1e25):
                _check(a, "nvfp4", launched, "quant_fp4_nv_bf16", global_scale=given)
        _check(a, "mxfp4", launched, "quant_fp4_mx_bf16")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("text", ["mxfp4", "nvfp4"])
def test_fp4_kernels_match_the_reference(launched, dtype, text):
    """4-bit float activations (act_quant_fp4.cuh): MXFP4's e8m0 scales, NVFP4's e4m3 scales with
    the global scale from the tensor's amax (two launches) or given (one), codes, scales and the
    global scale bit for bit."""
    if text == "nvfp4" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("nvfp4's float8e4m3 scales need sm_89 (cvt.satfinite); the reference serves older GPUs")
    gen = torch.Generator().manual_seed(_seed())
    act = "bf16" if dtype == torch.bfloat16 else "f16"
    symbol = f"quant_fp4_{'mx' if text == 'mxfp4' else 'nv'}_{act}"
    for rows, k in ((1, 64), (37, 4096), (300, 7168), (5, 16384), (2, 8960), (1, 28672)):
        a = _activations(rows, k, dtype, gen).cuda()
        _check(a, text, launched, symbol, _kernel("group", act, "x", rows, k)[1])
    if text == "nvfp4":
        assert f"quant_tensor_amax_{act}" in launched
        launched.clear()
        for given in (0.01, torch.tensor([3e-6]).cuda()):  # the second makes scales saturate at 448
            _check(a, text, launched, symbol, global_scale=given)
        assert f"quant_tensor_amax_{act}" not in launched


def test_a_long_decode_row_runs_in_parts(launched):
    """A decode row of 28,672 elements in several CTAs (cuda_quant.row_parts; a per-token row's
    parts one thread-block cluster exchanging their amax), bit for bit."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("a per-token row's parts are one thread-block cluster: sm_90+")
    gen = torch.Generator().manual_seed(_seed())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    parts = cuda_quant.row_parts(1, 28672 // 8, sms, cluster=True)
    assert parts > 1
    a = _activations(1, 28672, torch.bfloat16, gen).cuda()
    for text, symbol in (("int8:token", "quant_token_bf16_int8"), ("int8:g128", "quant_group_bf16_int8"),
                         ("int8:tensor", "quant_tensor_apply_bf16_int8"), ("mxfp4", "quant_fp4_mx_bf16")):
        launched.clear()
        _check(a, text, launched, symbol, parts)


def test_strided_and_3d_activations(launched):
    gen = torch.Generator().manual_seed(_seed())
    wide = _activations(24, 2048 + 64, torch.bfloat16, gen).cuda()
    _check(wide[:, 64:], "int8:token", launched, "quant_token_bf16_int8_wide")  # row stride 2112, 128-byte offset
    _check(wide[:, :2048].reshape(4, 6, 2048), "int8:g32", launched, "quant_group_bf16_int8_wide")
    launched.clear()
    ops.quantize_activation(wide[:, 4:2052], "int8:token")  # an 8-byte offset: the reference serves it
    assert launched == []


def test_quantization_replays_in_a_cuda_graph(launched):
    gen = torch.Generator().manual_seed(_seed())
    element = _elements()[-1]
    a = _activations(64, 4096, torch.bfloat16, gen).cuda()
    static = torch.tensor([0.5]).cuda()
    formats = [f"{element}:token", f"{element}:g128", f"{element}:tensor"]
    ops.quantize_activation(a, formats[0])  # the unit is loaded before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = [ops.quantize_activation(a, text) for text in formats]
        captured.append(ops.quantize_activation(a, formats[2], static_scale=static))
    a.copy_(_activations(64, 4096, torch.bfloat16, gen).cuda() * 3)
    graph.replay()
    torch.cuda.synchronize()
    for q, text, kwargs in zip(captured, formats + [formats[2]], [{}, {}, {}, {"static_scale": 0.5}], strict=True):
        ref = ActivationFormat.parse(text).quantize(a.cpu(), **kwargs)
        assert torch.equal(q.codes.cpu(), ref.codes) and torch.equal(q.scales.cpu(), ref.scales), text


def test_quantization_behind_a_gemm_reads_its_finished_output(launched):
    """From sm_90 the quant kernels launch with Programmatic Dependent Launch and wait for the
    upstream grid before they read: behind a GEMM of this library, which lets the next kernel
    launch as its CTAs run out of tiles, they must still see every row it writes (eagerly, no
    synchronization between the two, and in a CUDA graph), bit for bit against the reference."""
    import humming_aot
    from humming_aot import quant

    gen = torch.Generator().manual_seed(_seed())
    m, n, k = 96, 8192, 4096  # a GEMM whose output rows are written by its last tiles' epilogues
    packed = humming_aot.pack(quant.quantize(torch.randn(n, k, generator=gen), "int4:g128"), torch.bfloat16,
                              device="cuda")
    formats = [f"{_elements()[-1]}:token", f"{_elements()[-1]}:g128", "int8:tensor"]
    if torch.cuda.get_device_capability() >= (8, 9):
        formats.append("nvfp4")
    xs = [torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16) for _ in range(3)]
    for x in xs:
        for text in formats:
            y = ops.gemm(x, packed)
            q = ops.quantize_activation(y, text)
            ref = ActivationFormat.parse(text).quantize(y.cpu())
            assert torch.equal(q.codes.cpu(), ref.codes) and torch.equal(q.scales.cpu(), ref.scales), text
    sm90 = torch.cuda.get_device_capability()[0] >= 9 and os.environ.get("HUMMING_AOT_PDL", "1") != "0"
    assert launched.programmatic and set(launched.programmatic) == {sm90}
    y = ops.gemm(xs[0], packed)
    ops.quantize_activation(y, formats[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.gemm(xs[0], packed)
        captured = [ops.quantize_activation(y, text) for text in formats]
    xs[0].copy_(xs[1] * 2)
    graph.replay()
    torch.cuda.synchronize()
    for q, text in zip(captured, formats, strict=True):
        ref = ActivationFormat.parse(text).quantize(y.cpu())
        assert torch.equal(q.codes.cpu(), ref.codes) and torch.equal(q.scales.cpu(), ref.scales), text


def test_kernel_path_is_taken_for_what_the_kernels_support():
    a = torch.zeros(4, 64, dtype=torch.bfloat16).cuda()
    assert cuda_quant.supported(a, ActivationFormat.parse("int8:token"))
    assert not cuda_quant.supported(a.float(), ActivationFormat.parse("int8:token"))
