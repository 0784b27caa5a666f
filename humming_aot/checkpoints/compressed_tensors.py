"""compressed-tensors checkpoints (``quant_method: compressed-tensors``; llmcompressor, and the
converters of ModelOpt and AutoAWQ files).

Per layer with weight (N, K), by the format of its config group:

* ``pack-quantized`` (int, 1..8 bits): ``weight_packed`` int32 (N, ceil(K b / 32)), an LSB-first
  bitstream per row (compressed-tensors >= 0.19; older releases put 32 // b codes in each word and
  left the top bits unused, told apart by the number of words). A code is the signed value plus
  2^(b-1). ``weight_zero_point`` (asymmetric only): int32 (ceil(N b / 32), G) packed along N with
  the same offset, or an unpacked int8 (N, G) from older releases. ``weight_shape`` int (2,) = [N, K].
  ``weight_scale`` (N, G) or (N, 1), a multiplier in the model dtype. W = (q - z) * s.
* ``float-quantized`` / ``int-quantized`` / ``naive-quantized``: ``weight`` float8_e4m3fn or int8
  (N, K); ``weight_scale`` (1,) tensor, (N, 1) channel, (ceil(N / bn), ceil(K / bk)) block or
  (N, K / g) group.
* ``nvfp4-pack-quantized``: ``weight_packed`` uint8 (N, K / 2), the even k in the low nibble;
  ``weight_scale`` float8_e4m3fn (N, K / 16); ``weight_global_scale`` float32 (1,) which DIVIDES:
  W = e2m1 * weight_scale / weight_global_scale.
* ``mxfp4-pack-quantized``: the same nibbles, ``weight_scale`` uint8 e8m0 (N, K / 32).
* ``mxfp8-quantized``: ``weight`` float8_e4m3fn, ``weight_scale`` uint8 e8m0 (N, K / 32).
"""
from __future__ import annotations

import torch

from humming_aot.checkpoints._common import (
    E8M0_DTYPES,
    FLOAT_SCALE_DTYPES,
    check_scales_positive,
    e8m0_scales,
    float_scales,
    offset_to_signed,
    optional_bias,
    scalar_scale,
)
from humming_aot.checkpoints.activations import compressed_tensors_scheme
from humming_aot.checkpoints.bitstream import unpack_bitstream, unpack_nibbles, unpack_padded_words
from humming_aot.checkpoints.config import QuantConfig
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["load_layer", "scheme_for"]

_PACKED = ("pack-quantized",)
_UNPACKED = ("float-quantized", "int-quantized", "naive-quantized")
_FP4 = ("nvfp4-pack-quantized", "mxfp4-pack-quantized")
FORMATS = _PACKED + _UNPACKED + _FP4 + ("mxfp8-quantized",)


def _target_matches(target: str, prefix: str) -> bool:
    if target.startswith("re:"):
        import re

        return re.match(target[3:], prefix) is not None
    return prefix == target or prefix.endswith("." + target)


def scheme_for(qc: QuantConfig, prefix: str) -> tuple[str, dict, str]:
    """(group name, its ``weights`` args, its format) for the layer ``prefix``. Targets that name a
    module class (``Linear``) match every layer that has quantized tensors."""
    cfg = qc.config
    if cfg.get("transform_config"):
        raise qc.key_error("transform_config", "is set: the weights are rotated (Hadamard / SpinQuant) and need "
                                               "the rotation at run time, which humming_aot does not apply")
    sparsity = cfg.get("sparsity_config") or {}
    if sparsity.get("format") not in (None, "dense"):
        raise qc.key_error("sparsity_config", f"has format {sparsity.get('format')!r}; humming_aot loads dense "
                                              "compressed-tensors checkpoints only")
    groups = cfg.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise qc.key_error("config_groups", "is missing or empty; a compressed-tensors config needs at least one group")
    by_name, by_class = [], []
    for name, group in groups.items():
        for target in group.get("targets") or ():
            target = str(target)
            if _target_matches(target, prefix):
                by_name.append(name)
            elif "." not in target and not target.startswith("re:") and target[:1].isupper():
                by_class.append(name)
    chosen = by_name or by_class
    if len(set(chosen)) != 1:
        why = "matches no group" if not chosen else f"matches several groups ({', '.join(sorted(set(chosen)))})"
        raise qc.key_error("config_groups", f"targets: layer {prefix!r} {why}; humming_aot cannot tell its scheme")
    name = chosen[0]
    group = groups[name]
    if group.get("output_activations"):
        raise qc.key_error(f"config_groups.{name}.output_activations", "is set; output quantization is not served")
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise qc.key_error(f"config_groups.{name}.weights", "is missing; this group quantizes no weights")
    fmt = group.get("format") or cfg.get("format")
    if fmt == "mixed-precision" or fmt not in FORMATS:
        raise qc.key_error(f"config_groups.{name}.format", f"is {fmt!r}; humming_aot loads {', '.join(FORMATS)}")
    return name, weights, fmt


def load_layer(reader: CheckpointReader, qc: QuantConfig, prefix: str) -> CheckpointLayer:
    group, args, fmt = scheme_for(qc, prefix)
    where = f"config_groups.{group}.weights"
    if args.get("actorder") in ("group", "dynamic") or reader.has(f"{prefix}.weight_g_idx"):
        raise qc.key_error(f"{where}.actorder", "is 'group' (weight_g_idx): compressed-tensors removed it; "
                                                "humming_aot serves act-order for GPTQ checkpoints only")
    if fmt in _PACKED:
        qw = _pack_quantized(reader, qc, prefix, args, where)
    elif fmt in _FP4:
        qw = _fp4(reader, prefix, fmt)
    else:
        qw = _unpacked(reader, qc, prefix, args, where, fmt)
    activations = compressed_tensors_scheme(reader, qc.config["config_groups"][group].get("input_activations"), prefix)
    return CheckpointLayer(prefix=prefix, schema="compressed-tensors", weight=qw,
                           bias=optional_bias(reader, prefix, qw.shape[-2]), activations=activations)


def _granularity(qc: QuantConfig, args: dict, where: str, n: int, k: int) -> str:
    strategy = args.get("strategy")
    if strategy == "tensor":
        return "tensor"
    if strategy == "channel":
        return "channel"
    if strategy in ("group", "tensor_group"):
        g = args.get("group_size")
        if not isinstance(g, int) or g < 1 or k % g:
            raise qc.key_error(f"{where}.group_size", f"is {g!r}; it must be a positive divisor of K={k}")
        return f"g{g}"
    if strategy == "block":
        block = args.get("block_structure")
        if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) for b in block)):
            raise qc.key_error(f"{where}.block_structure", f"is {block!r}; expected [rows, columns]")
        return f"b{block[0]}x{block[1]}"
    raise qc.key_error(f"{where}.strategy", f"is {strategy!r}; expected tensor, channel, group or block")


def _scale_shape(gran: str, n: int, k: int) -> tuple:
    if gran == "tensor":
        return (None,)  # (1,) or 0-d: checked below
    if gran == "channel":
        return (n, None)
    if gran.startswith("b"):
        bn, bk = (int(v) for v in gran[1:].split("x"))
        return (-(-n // bn), -(-k // bk))
    return (n, k // int(gran[1:]))


def _read_scales(reader: CheckpointReader, name: str, gran: str, n: int, k: int) -> tuple[torch.Tensor, str]:
    shape = _scale_shape(gran, n, k)
    if gran == "tensor":
        scales, dtype = float_scales(reader, name, None, "a per-tensor weight_scale")
        if scales.numel() != 1:
            raise CheckpointError(f"{reader.file_of(name)}: tensor {name!r} has shape {tuple(scales.shape)}; a "
                                  "per-tensor scale holds one value")
        scales = scales.reshape(1)
    else:
        scales, dtype = float_scales(reader, name, shape, f"{gran} weight_scale")
        if gran == "channel" and scales.shape[1] != 1:
            raise CheckpointError(f"{reader.file_of(name)}: tensor {name!r} has shape {tuple(scales.shape)}, "
                                  f"expected ({n}, 1) for channel scales")
    check_scales_positive(reader, name, scales)
    return scales, dtype


def _pack_quantized(reader, qc, prefix, args, where) -> QuantizedWeight:
    bits = args.get("num_bits")
    if args.get("type", "int") != "int" or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise qc.key_error(f"{where}.num_bits", f"is {bits!r} ({args.get('type')}); pack-quantized holds 1..8-bit ints")
    packed_name, shape_name = f"{prefix}.weight_packed", f"{prefix}.weight_shape"
    shape = reader.tensor(shape_name, ("I64", "I32"), (2,), "weight_shape [N, K]").tolist()
    n, k = int(shape[0]), int(shape[1])
    cols = reader.shape(packed_name)[-1] if reader.has(packed_name) else None
    dense, padded = -(-k * bits // 32), -(-k // (32 // bits))
    words = reader.tensor(packed_name, ("I32",), (n, None), f"{bits}-bit weight_packed (N, words)")
    if cols == dense:
        codes = unpack_bitstream(words, bits, k)
    elif cols == padded:  # compressed-tensors <= 0.12: 32 // bits codes per word
        codes = unpack_padded_words(words, bits, k)
    else:
        raise CheckpointError(f"{reader.file_of(packed_name)}: tensor {packed_name!r} has {cols} words per row; "
                              f"K={k} at {bits} bits needs {dense} (dense) or {padded} (one word per {32 // bits} "
                              "codes)")
    gran = _granularity(qc, args, where, n, k)
    scales, dtype = _read_scales(reader, f"{prefix}.weight_scale", gran, n, k)
    if gran.startswith("b") or gran == "tensor":
        raise qc.key_error(f"{where}.strategy", f"is {args.get('strategy')!r}; pack-quantized ints are served with "
                                                "channel or group scales")
    if args.get("symmetric", True):
        fmt = WeightFormat.parse(f"int{bits}:{gran}:s={dtype}")
        return QuantizedWeight(format=fmt, codes=offset_to_signed(codes, bits), scales=scales)
    zp_name = f"{prefix}.weight_zero_point"
    groups = scales.shape[1]
    if reader.has(zp_name) and reader.dtype_name(zp_name) == "I8":  # unpacked (before compressed-tensors PR #296)
        signed = reader.tensor(zp_name, ("I8",), (n, groups), "an unpacked weight_zero_point").to(torch.int16)
        zeros = (signed + (1 << (bits - 1))).to(torch.uint8)
    else:
        zwords = reader.tensor(zp_name, ("I32",), (-(-n * bits // 32), groups), "packed weight_zero_point")
        zeros = unpack_bitstream(zwords.t(), bits, n).t().contiguous()
    fmt = WeightFormat.parse(f"uint{bits}:{gran}:zp:s={dtype}")
    return QuantizedWeight(format=fmt, codes=codes, scales=scales, zero_points=zeros)


def _fp4(reader, prefix, fmt) -> QuantizedWeight:
    packed_name, scale_name = f"{prefix}.weight_packed", f"{prefix}.weight_scale"
    shape = reader.shape(packed_name) if reader.has(packed_name) else None
    data = reader.tensor(packed_name, ("U8",), (None, None), "fp4 weight_packed (N, K / 2)")
    n, k = shape[0], shape[1] * 2
    codes = unpack_nibbles(data)
    if fmt == "mxfp4-pack-quantized":
        scales = e8m0_scales(reader, scale_name, (n, k // 32), "mxfp4 weight_scale (N, K / 32)")
        return QuantizedWeight(format=WeightFormat.parse("mxfp4"), codes=codes, scales=scales)
    scales = reader.tensor(scale_name, ("F8_E4M3",), (n, k // 16), "nvfp4 weight_scale (N, K / 16)").to(torch.float32)
    check_scales_positive(reader, scale_name, scales)
    gname = f"{prefix}.weight_global_scale"
    global_scale = scalar_scale(reader, gname, ("F32", "BF16", "F16"), "nvfp4 weight_global_scale")
    # compressed-tensors' global scale divides; the canonical one multiplies
    inverse = (1.0 / global_scale).to(torch.float32)
    return QuantizedWeight(format=WeightFormat.parse("nvfp4"), codes=codes, scales=scales, global_scale=inverse)


def _unpacked(reader, qc, prefix, args, where, fmt) -> QuantizedWeight:
    name = f"{prefix}.weight"
    shape = reader.shape(name) if reader.has(name) else None
    if fmt == "mxfp8-quantized":
        data = reader.tensor(name, ("F8_E4M3",), (None, None), "mxfp8 weight (N, K)")
        n, k = shape
        scales = e8m0_scales(reader, f"{prefix}.weight_scale", (n, k // 32), "mxfp8 weight_scale (N, K / 32)")
        return QuantizedWeight(format=WeightFormat.parse("mxfp8"), codes=data.view(torch.uint8), scales=scales)
    is_float = args.get("type") == "float"
    want = ("F8_E4M3",) if is_float else ("I8",)
    data = reader.tensor(name, want, (None, None), f"{fmt} weight ({'float8_e4m3fn' if is_float else 'int8'} (N, K))")
    n, k = shape
    bits = args.get("num_bits", 8)
    if bits != 8:
        raise qc.key_error(f"{where}.num_bits", f"is {bits!r}; {fmt} weights are 8-bit")
    gran = _granularity(qc, args, where, n, k)
    scale_name = f"{prefix}.weight_scale"
    if reader.has(scale_name) and reader.dtype_name(scale_name) in E8M0_DTYPES:
        raise CheckpointError(f"{reader.file_of(scale_name)}: tensor {scale_name!r} holds e8m0 exponents, but the "
                              f"config names {fmt}; expected float scales ({', '.join(FLOAT_SCALE_DTYPES)})")
    scales, dtype = _read_scales(reader, scale_name, gran, n, k)
    if gran.startswith("b"):
        bn, bk = (int(v) for v in gran[1:].split("x"))
        gran = f"b{bn}x{bk}"
    element = "float8e4m3" if is_float else "int8"
    qw_fmt = WeightFormat.parse(f"{element}:{gran}:s={dtype}")
    return QuantizedWeight(format=qw_fmt, codes=data.view(torch.uint8), scales=scales)
