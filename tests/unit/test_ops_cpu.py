"""The public op on CPU tensors (exact reference path), its fake implementation, QuantizedLinear,
and every bad-input error, all before any kernel launch."""
import math
import os

import pytest
import torch

import humming_aot
from humming_aot import ops


def _packed(fmt="int4:g128", n=192, k=256, act=torch.bfloat16, seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return humming_aot.pack(humming_aot.quantize(w, fmt), act_dtype=act)


# The expected values below are built without humming_aot's decode, dequantize, pack or
# effective_weight: from the QuantizedWeight fields (codes, scales, zero points) with the small
# float64 decode and the correctly rounded cast written here, and the operand roundings the op
# documents: (q - z) * s rounded once to the activation dtype; round(round(q - z) * s) with float
# zero points; decode(code) * s rounded once for float codes; the float64 product rounded once.

_SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11}
_MIN_FREXP_EXPONENT = {torch.bfloat16: -125, torch.float16: -13}  # frexp's exponent of the smallest normal
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # float4e2m1 magnitudes by the low 3 bits


def _round_exact(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 x rounded once, to nearest even, onto dtype's grid (kept as float64): numpy's frexp,
    ldexp and round are exact in float64. Subnormals share the smallest normal's spacing."""
    import numpy as np

    v = x.numpy()
    assert np.isfinite(v).all() and (np.abs(v) < torch.finfo(dtype).max).all(), "test values stay in range"
    p = _SIGNIFICAND_BITS[dtype]
    _, e = np.frexp(v)
    e = np.maximum(e, _MIN_FREXP_EXPONENT[dtype])
    return torch.from_numpy(np.ldexp(np.round(np.ldexp(v, p - e)), e - p))


def _decode(codes: torch.Tensor, element: str) -> torch.Tensor:
    """float64 values of uint8 codes: intB two's complement, uintB as is, float4e2m1 by table."""
    c = codes.to(torch.int64)
    if element.startswith("int"):
        bits = int(element[3:])
        return torch.where(c >= 2 ** (bits - 1), c - 2**bits, c).double()
    if element.startswith("uint"):
        return c.double()
    assert element == "float4e2m1", element
    magnitude = torch.tensor(_E2M1, dtype=torch.float64)[c & 7]
    return torch.where(c >= 8, -magnitude, magnitude)


def _expected_operand(qw, act: torch.dtype) -> torch.Tensor:
    """(N, K) float64: the weight the op multiplies with, from qw's fields (group or channel scales)."""
    n, k = qw.codes.shape
    groups = qw.scales.reshape(n, -1).shape[1]
    per_k = lambda t: t.reshape(n, groups).double().repeat_interleave(k // groups, dim=1)  # noqa: E731
    s = _round_exact(per_k(qw.scales), act)
    q = _decode(qw.codes, qw.format.element)
    if qw.zero_points is None:
        return _round_exact(q * s, act)
    z = per_k(qw.zero_points)
    if qw.format.zero_point.value == "float":
        return _round_exact(_round_exact(q - _round_exact(z, act), act) * s, act)
    return _round_exact((q - z) * s, act)


def _every_code(qw, seed: int):
    """qw with integer codes drawn uniformly over every value of the element (quantized noise
    leaves the extreme codes rare, and int1's symmetric recipe rounds every weight to 0)."""
    import dataclasses

    element = qw.format.element
    if not element.startswith(("int", "uint")):
        return qw
    bits = int(element.removeprefix("u")[3:])
    codes = torch.randint(0, 2**bits, qw.codes.shape, generator=torch.Generator().manual_seed(seed))
    return dataclasses.replace(qw, codes=codes.to(torch.uint8))


CPU_FORMATS = ["int4:g128", "uint4:g32:zp", "int8:channel", "int1:g64", "int3:g64", "uint5:g64:zp",
               "uint6:g64:zpf", "uint2:channel:zpf", "float4e2m1:g32"]


@pytest.mark.parametrize("fmt", CPU_FORMATS)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16], ids=str)
def test_cpu_op_equals_an_independent_float64_reference(fmt, act):
    gen = torch.Generator().manual_seed(1)
    qw = _every_code(humming_aot.quantize(torch.randn(192, 256, generator=gen) * 0.05, fmt), seed=2)
    packed = humming_aot.pack(qw, act_dtype=act)
    assert packed.global_scale == 1.0, "precondition: ordinary scales need no power of two moved out"
    w = _expected_operand(qw, act)
    a = torch.randn(5, 256, generator=gen).to(act)
    bias = torch.randn(192, generator=gen).to(act)
    out = ops.gemm(a, packed, bias)
    assert out.dtype == act and out.shape == (5, 192)
    expected = _round_exact(a.double() @ w.t() + bias.double(), act)
    assert torch.equal(out.double(), expected), f"fmt={fmt} act={act}: {(out.double() != expected).sum()} elements differ"


@pytest.mark.parametrize("fmt", ["int4:channel", "uint4:channel:zp"])
def test_hand_computed_weights(fmt):
    """Unit activations pick out single weights, whose values are written out here: the codes
    cycle through every value of the element, scale 1/4, zero point 3."""
    import dataclasses

    n, k = 64, 64
    qw = humming_aot.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(3)), fmt)
    col, row = torch.meshgrid(torch.arange(k), torch.arange(n), indexing="xy")
    codes = ((row + col) % 16).to(torch.uint8)
    zero_points = None if qw.zero_points is None else torch.full_like(qw.zero_points, 3)
    qw = dataclasses.replace(qw, codes=codes, scales=torch.full_like(qw.scales, 0.25), zero_points=zero_points)
    packed = humming_aot.pack(qw, act_dtype=torch.bfloat16)
    out = ops.gemm(torch.eye(k, dtype=torch.bfloat16), packed)  # out[j, i] = W[i, j]
    c = ((row + col) % 16).t()  # indexed [j, i]
    value = (c - 3) if zero_points is not None else torch.where(c >= 8, c - 16, c)  # int4: two's complement
    assert torch.equal(out, (value * 0.25).to(torch.bfloat16))
    assert out[0, 8].item() == (-2.0 if zero_points is None else 1.25)  # code 8: -8 * 1/4, or (8 - 3) / 4


def test_leading_dims_and_empty_m():
    gen = torch.Generator().manual_seed(4)
    qw = _every_code(humming_aot.quantize(torch.randn(192, 256, generator=gen), "int4:g128"), seed=5)
    packed = humming_aot.pack(qw, act_dtype=torch.bfloat16)
    a = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    bias = torch.randn(192, generator=gen).to(torch.bfloat16)
    out = ops.gemm(a, packed, bias)
    assert out.shape == (2, 3, 192) and out.dtype == torch.bfloat16
    w = _expected_operand(qw, torch.bfloat16)
    for i in range(2):
        for j in range(3):  # each leading index on its own: a reshape that mixed rows would fail here
            expected = _round_exact(a[i, j].double() @ w.t() + bias.double(), torch.bfloat16)
            assert torch.equal(out[i, j].double(), expected), (i, j)
    assert ops.gemm(torch.empty(0, 256, dtype=torch.bfloat16), packed).shape == (0, 192)
    assert ops.gemm(torch.empty(2, 0, 256, dtype=torch.bfloat16), packed).shape == (2, 0, 192)


def test_cpu_op_rounds_the_float64_sum_once():
    """torch's float64 -> bfloat16 cast goes through float32 and rounds twice; the op must not:
    1 + 2^-8 + 2^-30 is above the tie, so it rounds up to 1 + 2^-7."""
    from humming_aot.formats import round_to

    x = torch.tensor([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 1 + 2**-8, 1 + 3 * 2**-8], dtype=torch.float64)
    assert round_to(x, torch.bfloat16).tolist() == [1 + 2**-7, -(1 + 2**-7), 1.0, 1 + 2**-6]
    assert x[:1].to(torch.bfloat16).item() == 1.0, "torch's cast no longer rounds twice: this test can drop round_to"
    y = torch.tensor([1 + 2**-11 + 2**-40], dtype=torch.float64)
    assert round_to(y, torch.float16).item() == 1 + 2**-10
    gen = torch.Generator().manual_seed(6)
    for dtype in (torch.bfloat16, torch.float16):
        # near-ties: a 16-bit grid point plus half a spacing, nudged by a few float64 ulps either way
        grid = torch.randn(4096, generator=gen, dtype=torch.float64)
        grid = _round_exact(grid, dtype)
        _, e = torch.frexp(grid)
        half = torch.ldexp(torch.ones_like(grid), e - _SIGNIFICAND_BITS[dtype] - 1)
        nudge = torch.randint(-3, 4, grid.shape, generator=gen) * 2.0**-40
        near = grid + half * (1 + nudge)
        assert torch.equal(round_to(near, dtype).double(), _round_exact(near, dtype)), dtype
    # the op itself: the exact sum 1 + 2^-8 + 2^-30 from exactly representable operands
    qw = humming_aot.quantize(torch.ones(64, 64), "int8:channel")
    import dataclasses

    codes = torch.zeros(64, 64, dtype=torch.uint8)
    codes[:, :3] = 1
    qw = dataclasses.replace(qw, codes=codes, scales=torch.ones_like(qw.scales))
    packed = humming_aot.pack(qw, act_dtype=torch.bfloat16)
    a = torch.zeros(1, 64, dtype=torch.bfloat16)
    a[0, :3] = torch.tensor([1.0, 2**-8, 2**-30])
    assert ops.gemm(a, packed)[0, 0].item() == 1 + 2**-7


def test_fake_impl_traces_under_torch_compile():
    packed = _packed()
    a = torch.randn(4, 256).to(torch.bfloat16)
    fn = torch.compile(lambda x: ops.gemm(x, packed), fullgraph=True, backend="eager")
    assert torch.equal(fn(a), ops.gemm(a, packed))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa = mode.from_tensor(a)
        out = torch.ops.humming_aot.gemm_wna16(
            fa, mode.from_tensor(packed.w), mode.from_tensor(packed.w_scale), None, None,
            packed.w_dtype, packed.n, packed.k, packed.group_size, packed.global_scale, packed.float_zero_point,
        )
        assert out.shape == (4, 192) and out.dtype == torch.bfloat16


def test_quantized_linear_from_linear_matches_reference():
    lin = torch.nn.Linear(256, 128, bias=True)
    q = humming_aot.nn.QuantizedLinear.from_linear(lin, "int4:g64")
    x = torch.randn(3, 256)
    with pytest.raises(ValueError, match="dtype"):
        q(x)  # float32 activations: the weight was packed for bfloat16
    y = q(x.to(torch.bfloat16))
    ref = _round_exact(x.to(torch.bfloat16).double() @ q.packed.dequantized().double().t() + q.bias.double(), torch.bfloat16)
    assert torch.equal(y.double(), ref)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: (torch.randn(4, 256), p, None), "a.dtype=torch.float32"),
        (lambda p: (torch.randn(4, 128).bfloat16(), p, None), "K=256"),
        (lambda p: (torch.randn(256, 4).bfloat16().t(), p, None), "unit stride"),
        (lambda p: (torch.randn(4, 256).bfloat16(), p, torch.randn(7).bfloat16()), r"bias must be a tensor of shape \(192,\)"),
        (lambda p: (torch.randn(4, 256).bfloat16(), p, torch.randn(192)), "bias must be a contiguous"),
    ],
)
def test_bad_inputs_raise_clear_value_errors(make, match):
    a, packed, bias = make(_packed())
    with pytest.raises(ValueError, match=match):
        ops.gemm(a, packed, bias)


def test_wrong_weight_type_is_a_type_error():
    with pytest.raises(TypeError, match="PackedWeight"):
        ops.gemm(torch.randn(2, 256).bfloat16(), object())


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8", "float4e0m3:g32:s=float8e8m0"])
def test_cpu_gemm_with_float_weights_is_the_reference_rounded_once(fmt):
    """Float weights whose scales the activation dtype holds exactly: the CPU op equals the float64
    product with humming_aot.dequantize's weights, rounded once to bfloat16."""
    gen = torch.Generator().manual_seed(5)
    qw = humming_aot.quantize(torch.randn(128, 256, generator=gen) * 0.05, fmt)
    packed = humming_aot.pack(qw, act_dtype=torch.bfloat16)
    a = torch.randn(7, 256, generator=gen).to(torch.bfloat16)
    expected = _round_exact(a.double() @ humming_aot.dequantize(qw).double().T, torch.bfloat16)
    assert torch.equal(ops.gemm(a, packed).double(), expected)


def test_cpu_gemm_applies_the_global_scale():
    gen = torch.Generator().manual_seed(6)
    qw = humming_aot.quantize(torch.randn(128, 256, generator=gen) * 0.05, "nvfp4")
    packed = humming_aot.pack(qw, act_dtype=torch.bfloat16)
    # pack may move a power of two between the e4m3 group scales and the global scale
    ratio = packed.global_scale / float(qw.global_scale)
    assert ratio == 2.0 ** round(math.log2(ratio))
    a = torch.randn(5, 256, generator=gen).to(torch.bfloat16)
    bias = torch.randn(128, generator=gen).to(torch.bfloat16)
    w = packed.dequantized().double() * packed.global_scale
    assert torch.equal(ops.gemm(a, packed, bias).double(), _round_exact(a.double() @ w.T + bias.double(), torch.bfloat16))


def _every_supported_spec():
    from humming_aot import support
    from humming_aot.spec import GemmType

    # (W8A8 runs through humming_aot.w8a8 with its own CPU reference: tests/unit/test_w8a8.py)
    specs = {spec for arch in support.supported_archs()
             for spec in support.supported_specs(arch, GemmType.DENSE) if not spec.a_is_quantized}
    return [pytest.param(s, id=f"{s.a_dtype}-{s.w_dtype}-{s.w_zero_point.value}") for s in sorted(specs, key=str)]


@pytest.mark.parametrize("spec", _every_supported_spec())
def test_every_supported_pairing_matches_dequantize_on_cpu(spec):
    """Every (activation, weight, zero point) the support matrix allows: quantize with scales in
    the activation dtype, pack, and the CPU op. The op is the float64 product with the packed
    operand, rounded once; that operand is humming_aot.dequantize's weight up to the roundings
    the kernel makes in the activation dtype (one; two with float zero points)."""
    act = getattr(torch, spec.a_dtype)
    zp = {"none": "", "zpi": ":zp", "zpf": ":zpf"}[spec.w_zero_point.value]
    gen = torch.Generator().manual_seed(len(spec.w_dtype) + 7 * len(zp))
    qw = humming_aot.quantize(torch.randn(128, 256, generator=gen) * 0.05, f"{spec.w_dtype}:g64{zp}:s={spec.a_dtype}")
    packed = humming_aot.pack(qw, act_dtype=act)
    assert ops.gemm_spec(packed) == spec
    a = torch.randn(3, 256, generator=gen).to(act)
    out = ops.gemm(a, packed)
    assert torch.equal(out.double(), _round_exact(a.double() @ packed.effective_weight().t(), act))
    reference = humming_aot.dequantize(qw).double()
    eps = 2.0**-8 if act == torch.bfloat16 else 2.0**-11  # half an ulp, relative
    roundings = 2 if zp == ":zpf" else 1
    idx = torch.arange(256) // 64
    scale = qw.scales.double()[:, idx]
    # the second rounding (q - z) is relative to |q - z| <= 2^b, i.e. to 2^b x scale
    bound = eps * (reference.abs() + (roundings - 1) * scale * 2**packed.bits) + 2.0**-24 * (act == torch.float16)
    assert ((packed.effective_weight() - reference).abs() <= bound).all()


def test_effective_weight_of_a_cpu_gemm_is_the_rounded_operand():
    """ops.effective_weight names the weight the dispatched kernel multiplies with; the CPU path
    is the reference with scales rounded into the weights, whatever M."""
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(128, 256) * 0.05, "int4:g64"), act_dtype=torch.bfloat16)
    for m in (1, 8, 100):
        assert torch.equal(ops.effective_weight(packed, m), packed.effective_weight())


def test_effective_weight_on_cuda_asks_the_dispatcher_for_the_key_without_loading_it(monkeypatch):
    """The CUDA branch (no GPU here: the dispatcher's pieces are stand-ins): the key that
    obtain.select_key picks for (spec, device, m, K, group) decides the scale model."""
    import types

    from humming_aot import dispatch
    from humming_aot import obtain as kernel_obtain

    asked = []

    def select_key(spec, info, m, tile=None, k=None, group=None, n=None):
        asked.append((spec, info, m, tile, k, group, n))
        return types.SimpleNamespace(scales_in_fp32=m <= 8)

    monkeypatch.setattr(kernel_obtain, "select_key", select_key)
    monkeypatch.setattr(dispatch, "device_info", lambda index: f"device {index}")
    monkeypatch.setattr(ops, "gemm_spec", lambda packed: "spec")
    packed = types.SimpleNamespace(device=torch.device("cuda", 1), n=2048, k=4096, group_size=128,
                                   effective_weight=lambda scales_in_fp32=False: ("weight", scales_in_fp32))
    assert ops.effective_weight(packed, 8) == ("weight", True)
    assert ops.effective_weight(packed, 9) == ("weight", False)
    assert asked == [("spec", "device 1", 8, None, 4096, 128, 2048), ("spec", "device 1", 9, None, 4096, 128, 2048)]


# Packed-layout versions (humming_aot/packed_layout.py): words packed under another layout of the
# same width decode to other weights, so they are refused before any launch.

def test_packed_weights_record_the_layout_version_of_their_width():
    from humming_aot.packed_layout import layout_version

    assert [layout_version(b) for b in range(1, 9)] == [2, 1, 1, 1, 1, 1, 1, 1]
    for fmt, bits in (("int1:g128", 1), ("int4:g128", 4), ("uint3:g32:zp", 3), ("float8e4m3:channel", 8)):
        packed = _packed(fmt)
        assert packed.bits == bits and packed.layout_version == layout_version(bits)
        assert packed.to("cpu").layout_version == packed.layout_version


@pytest.mark.parametrize("fmt", ["int1:g128", "int4:g128"])
def test_gemm_refuses_a_weight_of_another_layout_version(fmt):
    import dataclasses

    packed = _packed(fmt)
    a = torch.randn(3, 256).bfloat16()
    stale = dataclasses.replace(packed, layout_version=packed.layout_version + 1)
    with pytest.raises(ValueError, match=rf"{packed.bits}-bit codes with layout version {packed.layout_version + 1}"):
        ops.gemm(a, stale)
    with pytest.raises(ValueError, match="layout version"):
        stale.dequantized()  # unpack() refuses it too
    assert torch.equal(ops.gemm(a, packed), ops.gemm(a, dataclasses.replace(packed)))


def test_a_weight_unpickled_from_before_versions_is_refused_only_where_the_layout_changed():
    import pickle

    a = torch.randn(2, 256).bfloat16()
    for fmt, refused in (("int1:g128", True), ("int2:g128", False)):
        packed = _packed(fmt)
        state = dict(vars(packed))
        del state["layout_version"]  # as pickled before the field existed
        old = object.__new__(type(packed))
        old.__dict__.update(state)
        old = pickle.loads(pickle.dumps(old))
        if refused:
            with pytest.raises(ValueError, match="no layout version"):
                ops.gemm(a, old)
        else:
            assert torch.equal(ops.gemm(a, old), ops.gemm(a, packed))


def test_quantized_linear_state_dict_carries_and_checks_the_layout_version(tmp_path):
    lin = torch.nn.Linear(256, 128, bias=False)
    q1 = humming_aot.nn.QuantizedLinear.from_linear(lin, "int1:g128")
    state = q1.state_dict()
    assert all(isinstance(value, torch.Tensor) for value in state.values())  # tensor-only formats hold it
    assert state["packed_layout_version"].dtype == torch.int32 and int(state["packed_layout_version"]) == 2
    torch.save(state, tmp_path / "q1.pt")
    fresh = humming_aot.nn.QuantizedLinear.from_linear(torch.nn.Linear(256, 128, bias=False), "int1:g128")
    fresh.load_state_dict(torch.load(tmp_path / "q1.pt", weights_only=True))
    assert torch.equal(fresh.w, q1.w)

    before = fresh.w.clone()
    stale = dict(state, packed_layout_version=torch.tensor(1, dtype=torch.int32), w=torch.zeros_like(state["w"]))
    with pytest.raises(ValueError, match="1-bit codes with layout version 1"):
        fresh.load_state_dict(stale)
    assert torch.equal(fresh.w, before)  # refused before any tensor was copied
    unversioned = {key: value for key, value in stale.items() if key != "packed_layout_version"}
    with pytest.raises(ValueError, match="no layout version"):
        fresh.load_state_dict(unversioned)
    assert torch.equal(fresh.w, before)

    # a width whose layout never changed loads a state dict saved before versions were recorded
    q4 = humming_aot.nn.QuantizedLinear.from_linear(lin, "int4:g128")
    old4 = {key: value for key, value in q4.state_dict().items() if key != "packed_layout_version"}
    target = humming_aot.nn.QuantizedLinear.from_linear(torch.nn.Linear(256, 128, bias=False), "int4:g128")
    target.load_state_dict(old4)  # strict: the missing version is not an error
    assert torch.equal(target.w, q4.w) and int(target.packed_layout_version) == 1
    nested = torch.nn.Sequential(q1)
    with pytest.raises(ValueError, match=r"QuantizedLinear 0 \(int1:g128\)"):
        nested.load_state_dict({f"0.{key}": value for key, value in stale.items()})


@pytest.mark.parametrize("fmt,n,k", [("int4:g128", 192, 384), ("uint4:g64:zpf", 128, 256), ("nvfp4", 128, 256),
                                     ("float8e4m3:channel", 100, 200)])
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_gemm_backward_gives_the_activations_and_bias_gradients(fmt, n, k, act):
    """grad_a = grad @ W with W the forward's exact weight (global scale and padding included), in
    float32 and rounded once; grad_bias the rows' sum; the packed weight takes none."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(n, k, generator=gen) * 0.1, fmt), act_dtype=act)
    a = torch.randn(3, 5, k, generator=gen).to(act).requires_grad_()
    bias = torch.randn(n, generator=gen).to(act).requires_grad_()
    out = ops.gemm(a, packed, bias)
    grad = torch.randn(out.shape, generator=gen).to(act)
    out.backward(grad)
    weight = packed.effective_weight()[:n, :k]
    expected = (grad.double().reshape(-1, n) @ weight).reshape(3, 5, k)
    bound = 2.0 ** -(_SIGNIFICAND_BITS[act]) * expected.abs() + 1e-6 * (grad.double().abs().reshape(-1, n)
                                                                       @ weight.abs()).reshape(3, 5, k)
    assert a.grad.shape == a.shape and a.grad.dtype == act
    assert bool(((a.grad.double() - expected).abs() <= bound).all()), f"seed={seed}"
    bias_expected = grad.double().sum((0, 1))
    assert bool(((bias.grad.double() - bias_expected).abs() <= 2.0 ** -(_SIGNIFICAND_BITS[act])
                 * bias_expected.abs() + 1e-6 * grad.double().abs().sum((0, 1))).all()), f"seed={seed}"
    assert not packed.w.requires_grad and packed.w.grad is None


@pytest.mark.parametrize("fmt", ["int4:g128", "uint4:g64:zpf"])
def test_the_op_passes_torch_opcheck_with_gradients(fmt):
    """The schema, fake implementation and autograd formula of humming_aot::gemm_wna16 as torch's
    opcheck sees them, a traced backward (AOT autograd, static and dynamic shapes) included: the
    backward's weight is one op (humming_aot::dequantize_packed), not the unpacking traced."""
    packed = _packed(fmt, n=128, k=256)
    a = torch.randn(4, 256).to(torch.bfloat16).requires_grad_()
    bias = torch.randn(128).to(torch.bfloat16).requires_grad_()
    args = (a, packed.w, packed.w_scale, packed.w_zero_point, bias, packed.w_dtype, packed.n, packed.k,
            packed.group_size, packed.global_scale, packed.float_zero_point)
    torch.library.opcheck(torch.ops.humming_aot.gemm_wna16.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_static", "test_aot_dispatch_dynamic"))
