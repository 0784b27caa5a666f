"""The public op on CPU tensors (exact reference path), its fake implementation, QuantizedLinear,
and every bad-input error, all before any kernel launch."""
import math

import pytest
import torch

import humming_aot
from humming_aot import ops


def _packed(fmt="int4:g128", n=192, k=256, act=torch.bfloat16, seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return humming_aot.pack(humming_aot.quantize(w, fmt), act_dtype=act)


@pytest.mark.parametrize("fmt", ["int4:g128", "uint4:g32:zp", "int8:channel"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_cpu_path_is_dequantize_plus_float64_matmul(fmt, act):
    packed = _packed(fmt, act=act)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(5, 256, generator=gen).to(act)
    bias = torch.randn(192, generator=gen).to(act)
    out = ops.gemm(a, packed, bias)
    ref = (a.double() @ packed.dequantized().double().t() + bias.double()).to(act)
    assert out.dtype == act and out.shape == (5, 192)
    assert torch.equal(out, ref)


def test_leading_dims_and_empty_m():
    packed = _packed()
    a = torch.randn(2, 3, 256).to(torch.bfloat16)
    assert ops.gemm(a, packed).shape == (2, 3, 192)
    assert ops.gemm(torch.empty(0, 256, dtype=torch.bfloat16), packed).shape == (0, 192)


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
    ref = (x.to(torch.bfloat16).double() @ q.packed.dequantized().double().t() + q.bias.double()).to(torch.bfloat16)
    assert torch.equal(y, ref)


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
    expected = (a.double() @ humming_aot.dequantize(qw).double().T).to(torch.bfloat16)
    assert torch.equal(ops.gemm(a, packed), expected)


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
    assert torch.equal(ops.gemm(a, packed, bias), (a.double() @ w.T + bias.double()).to(torch.bfloat16))


def _every_supported_spec():
    from humming_aot import support

    specs = {spec for arch in support.supported_archs() for spec in support.supported_specs(arch)}
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
    assert torch.equal(out, (a.double() @ packed.effective_weight().t()).to(act))
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

    def select_key(spec, info, m, tile=None, k=None, group=None):
        asked.append((spec, info, m, tile, k, group))
        return types.SimpleNamespace(scales_in_fp32=m <= 8)

    monkeypatch.setattr(kernel_obtain, "select_key", select_key)
    monkeypatch.setattr(dispatch, "device_info", lambda index: f"device {index}")
    monkeypatch.setattr(ops, "gemm_spec", lambda packed: "spec")
    packed = types.SimpleNamespace(device=torch.device("cuda", 1), k=4096, group_size=128,
                                   effective_weight=lambda scales_in_fp32=False: ("weight", scales_in_fp32))
    assert ops.effective_weight(packed, 8) == ("weight", True)
    assert ops.effective_weight(packed, 9) == ("weight", False)
    assert asked == [("spec", "device 1", 8, None, 4096, 128), ("spec", "device 1", 9, None, 4096, 128)]


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
