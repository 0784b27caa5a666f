"""The eager path of ops.gemm on CUDA tensors (ops._gemm_planned: a cached launch plan, past the
dispatcher; then ops._gemm_bound: the plan's launch bound to the weight): the same bits as the
general path for every input layout it takes or declines, every bad-input error with its message
before and after a plan exists, modes and autograd still seeing the op, QuantizedLinear in a CUDA
graph."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.testing.numerics import assert_bitwise_equal

N, K = 320, 512


@pytest.fixture(scope="module")
def packed():
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(N, K, device="cuda", generator=gen) * 0.05
    return humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16)


def _reference(a, packed, bias):
    """The general path's launch on a contiguous 2-d copy, into a NaN-filled output."""
    a2 = a.reshape(-1, K).contiguous()
    out = torch.full((a2.shape[0], N), float("nan"), dtype=a.dtype, device="cuda")
    dispatch.launch_gemm(a2, packed, bias, ops.gemm_spec(packed), out=out)
    return out.reshape(*a.shape[:-1], N)


def _layouts():
    rows = torch.randn(5, K + 64, device="cuda").bfloat16()
    return {
        "1-d": torch.randn(K, device="cuda").bfloat16(),
        "2-d": torch.randn(3, K, device="cuda").bfloat16(),
        "3-d": torch.randn(2, 4, K, device="cuda").bfloat16(),
        "padded rows": rows[:, :K],  # row stride K + 64: taken as is
        "3-d transposed": torch.randn(4, 2, K, device="cuda").bfloat16().transpose(0, 1),  # declined: copied
        "M = 0": torch.empty(0, K, device="cuda").bfloat16(),
    }


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("layout", ["1-d", "2-d", "3-d", "padded rows", "3-d transposed", "M = 0"])
def test_every_layout_gives_the_general_paths_bits(packed, layout, with_bias):
    a = _layouts()[layout]
    bias = torch.randn(N, device="cuda").bfloat16() if with_bias else None
    out = ops.gemm(a, packed, bias)
    assert out.shape == (*a.shape[:-1], N) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert_bitwise_equal(out, _reference(a, packed, bias), f"layout={layout} bias={with_bias}")


def _bad_inputs(packed):
    a = torch.randn(4, K, device="cuda").bfloat16()
    flat = torch.randn(4 * K + 8, device="cuda").bfloat16()
    wide = torch.randn(4, K + 4, device="cuda").bfloat16()
    bias_flat = torch.randn(N + 2, device="cuda").bfloat16()
    return [
        ((a.float(), packed, None), "a.dtype=torch.float32"),
        ((a[:, :128], packed, None), "K=512"),
        ((torch.randn(K, 4, device="cuda").bfloat16().t(), packed, None), "unit stride"),
        ((a, packed, torch.randn(7, device="cuda").bfloat16()), r"bias must be a tensor of shape \(320,\)"),
        ((a, packed, torch.randn(N, device="cuda")), "bias must be a contiguous"),
        ((a, packed, torch.randn(N, 2, device="cuda").bfloat16()[:, 0]), "bias must be a contiguous"),
        ((a, packed, torch.randn(N).bfloat16()), "bias must be a contiguous"),
        ((a, packed.to("cpu"), None), "a is on cuda:0 but the packed weight is on cpu"),
        ((flat[1:1 + 4 * K].view(4, K), packed, None), "16-byte boundaries"),
        ((wide[:, :K], packed, None), "row stride 516"),
        ((a, packed, bias_flat[1:1 + N]), "4-byte boundary"),
    ]


def test_bad_inputs_raise_their_messages_before_and_after_a_plan_exists(packed):
    for warm in (False, True):
        if warm:
            ops.gemm(torch.randn(4, K, device="cuda").bfloat16(), packed, torch.randn(N, device="cuda").bfloat16())
        for (a, weight, bias), match in _bad_inputs(packed):
            with pytest.raises(ValueError, match=match):
                ops.gemm(a, weight, bias)
    with pytest.raises(TypeError, match="expected a PackedWeight"):
        ops.gemm(torch.randn(4, K, device="cuda").bfloat16(), packed.w)


def test_the_plan_is_made_once(packed, monkeypatch):
    a = torch.randn(6, K, device="cuda").bfloat16()
    first = ops.gemm(a, packed)

    def no_second_plan(*args, **kwargs):
        raise AssertionError("the launch plan was made again")

    monkeypatch.setattr(dispatch, "launch_plan", no_second_plan)
    for _ in range(3):
        assert_bitwise_equal(ops.gemm(a, packed), first, "planned call")


@pytest.mark.parametrize("shape", [(K,), (5, K), (2, 3, K)], ids=["1-d", "2-d", "3-d"])
def test_a_repeated_shape_takes_the_bound_launch_with_the_same_bits(shape, monkeypatch):
    gen = torch.Generator(device="cuda").manual_seed(1)
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(N, K, device="cuda", generator=gen) * 0.05,
                                                   "int4:g128"), act_dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda").bfloat16()
    ops.gemm(torch.randn(*shape, device="cuda").bfloat16(), packed, bias)  # the planned path binds
    stream = dispatch.current_stream(torch.cuda.current_device())
    assert list(packed.__dict__["_bound_launches"]) == [(torch.Size(shape), torch.cuda.current_device(), stream)]

    def not_planned(*args, **kwargs):
        raise AssertionError("the planned path ran for a shape with a bound launch")

    with monkeypatch.context() as patch:
        patch.setattr(ops, "_gemm_planned", not_planned)
        for with_bias in (True, False):
            a = torch.randn(*shape, device="cuda").bfloat16()
            out = ops.gemm(a, packed, bias if with_bias else None)
            assert out.shape == (*shape[:-1], N)
            assert_bitwise_equal(out, _reference(a, packed, bias if with_bias else None), f"bound, bias={with_bias}")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # another stream: its own launch
        a = torch.randn(*shape, device="cuda").bfloat16()
        out = ops.gemm(a, packed)
    side.synchronize()
    assert len(packed.__dict__["_bound_launches"]) == 2
    assert_bitwise_equal(out, _reference(a, packed, None), "bound on a side stream")
    for clone in (pickle.loads(pickle.dumps(packed)), copy.deepcopy(packed)):  # bound launches stay behind
        assert "_bound_launches" not in clone.__dict__ and torch.equal(clone.w, packed.w)


def test_a_bound_launch_follows_weight_storage_swapped_in_place():
    """`.data =` (or load_state_dict(assign=True)) gives the same tensor objects new storage: the
    bound launch of the old addresses must not run (it would read freed memory)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    first, second = (humming_aot.pack(humming_aot.quantize(torch.randn(N, K, device="cuda", generator=gen) * 0.05,
                                                           "int4:g128"), act_dtype=torch.bfloat16) for _ in range(2))
    a = torch.randn(4, K, device="cuda").bfloat16()
    ops.gemm(a, first)
    assert len(first.__dict__["_bound_launches"]) == 1
    first.w.data = second.w.clone()
    first.w_scale.data = second.w_scale.clone()
    assert_bitwise_equal(ops.gemm(a, first), _reference(a, second, None), "after the swap")
    assert_bitwise_equal(ops.gemm(a, first), _reference(a, second, None), "bound again after the swap")


class _SeenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_modes_and_autograd_still_see_the_op(packed):
    a = torch.randn(3, K, device="cuda").bfloat16()
    eager = ops.gemm(a, packed)
    with _SeenOps() as mode:
        out = ops.gemm(a, packed)
    assert any("humming_aot.gemm_wna16" in name for name in mode.seen), mode.seen
    assert_bitwise_equal(out, eager, "under a dispatch mode")
    with torch.device("cuda"):
        assert_bitwise_equal(ops.gemm(a, packed), eager, "under a torch function mode")
    grad_input = a.clone().requires_grad_(True)
    assert_bitwise_equal(ops.gemm(grad_input, packed).detach(), eager, "input that requires grad")


def test_quantized_linear_eager_and_in_a_cuda_graph():
    lin = torch.nn.Linear(K, N, bias=True).cuda().to(torch.bfloat16)
    q = humming_aot.nn.QuantizedLinear.from_linear(lin, "int4:g128")
    x = torch.randn(2, 3, K, device="cuda").bfloat16()
    eager = q(x)
    assert_bitwise_equal(eager, _reference(x, q.packed, q.bias), "QuantizedLinear eager")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = q(x)
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(static_out, eager, "QuantizedLinear graph replay")
