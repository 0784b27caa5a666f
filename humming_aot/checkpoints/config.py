"""Which schema a checkpoint uses, and which of its layers stay unquantized.

The schema comes from ``config.json``'s ``quantization_config.quant_method`` (or, for ModelOpt,
from ``hf_quant_config.json``), refined by ``checkpoint_format`` / ``format`` (GPTQ v1 or v2),
``packing_format`` (auto-round) and ``quant_algo`` (ModelOpt). Layers named by ``ignore``
(compressed-tensors), ``modules_to_not_convert`` (AWQ, fp8, mxfp4), ``exclude_modules`` (ModelOpt)
or a GPTQ ``dynamic`` ``-:`` rule stay in the model's float dtype.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import re
from pathlib import Path

from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader

__all__ = ["QuantConfig", "SCHEMAS", "read_quant_config"]

SCHEMAS = ("gptq", "awq", "compressed-tensors", "fp8", "modelopt", "mxfp4", "hqq")
_ALIASES = {"auto-round": "auto-round", "auto_round": "auto-round", "intel/auto-round": "auto-round"}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QuantConfig:
    """The quantization config of one checkpoint.

    schema:   one of SCHEMAS (auto-round is routed to gptq or awq by its packing_format)
    config:   the ``quantization_config`` dict (for ModelOpt, merged with hf_quant_config.json's
              ``quantization``)
    source:   the file it came from, for error messages
    """

    schema: str
    config: dict
    source: Path

    def key_error(self, key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: quantization_config key {key!r} {why}")

    def is_excluded(self, prefix: str) -> bool:
        """True when the layer ``prefix`` stays unquantized under the config's rules."""
        cfg = self.config
        for key in ("ignore", "modules_to_not_convert", "exclude_modules"):
            for rule in cfg.get(key) or ():
                if _matches(str(rule), prefix):
                    return True
        if self.schema == "gptq":
            for rule in (cfg.get("dynamic") or {}):
                if rule.startswith("-:") and re.match(rule[2:], prefix):
                    return True
            if not cfg.get("lm_head", False) and prefix.split(".")[-1] == "lm_head":
                return True
        return False

    def gptq_overrides(self, prefix: str) -> dict:
        """GPTQModel ``dynamic`` ``+:`` (or bare) regex rules: per-layer bits / group_size / sym."""
        out = {}
        for rule, values in (self.config.get("dynamic") or {}).items():
            pattern = rule[2:] if rule.startswith(("+:", "-:")) else rule
            if not rule.startswith("-:") and re.match(pattern, prefix) and isinstance(values, dict):
                out.update(values)
        return out


def _matches(rule: str, prefix: str) -> bool:
    """compressed-tensors 're:' regexes, shell globs, module names or name suffixes (AWQ and fp8 list
    bare names such as 'lm_head' or 'self_attn')."""
    if rule.startswith("re:"):
        return re.match(rule[3:], prefix) is not None
    if any(c in rule for c in "*?["):
        return fnmatch.fnmatchcase(prefix, rule)
    return prefix == rule or prefix.endswith("." + rule) or ("." + rule + ".") in ("." + prefix + ".")


def read_quant_config(reader: CheckpointReader) -> QuantConfig | None:
    """The checkpoint's QuantConfig, or None for an unquantized model (no quantization_config)."""
    config_path = reader.model_dir / "config.json"
    modelopt_path = reader.model_dir / "hf_quant_config.json"
    qcfg = None
    if config_path.exists():
        config = reader.read_json(config_path)
        qcfg = config.get("quantization_config") if isinstance(config, dict) else None
    if modelopt_path.exists():
        data = reader.read_json(modelopt_path)
        quant = data.get("quantization") if isinstance(data, dict) else None
        if not isinstance(quant, dict):
            raise CheckpointError(f"{modelopt_path}: no 'quantization' object; re-export the checkpoint")
        merged = {**(qcfg or {}), **quant, "quant_method": "modelopt"}
        return QuantConfig(schema="modelopt", config=merged, source=modelopt_path)
    if qcfg is None:
        if not config_path.exists():
            raise CheckpointError(f"{reader.model_dir}: no config.json; a checkpoint directory needs one")
        return None
    if not isinstance(qcfg, dict):
        raise CheckpointError(f"{config_path}: quantization_config is not an object")
    method = qcfg.get("quant_method")
    if not isinstance(method, str):
        raise CheckpointError(f"{config_path}: quantization_config has no 'quant_method' string; "
                              f"expected one of {', '.join(SCHEMAS + ('auto-round',))}")
    method = _ALIASES.get(method.lower(), method.lower())
    if method == "auto-round":
        return _route_auto_round(qcfg, config_path)
    if method not in SCHEMAS:
        raise CheckpointError(f"{config_path}: quantization_config key 'quant_method' is {qcfg['quant_method']!r}, "
                              f"which humming_aot does not load; it loads {', '.join(SCHEMAS + ('auto-round',))}")
    return QuantConfig(schema=method, config=qcfg, source=config_path)


def _route_auto_round(qcfg: dict, path: Path) -> QuantConfig:
    packing = str(qcfg.get("packing_format", "auto_round:auto_gptq"))
    if qcfg.get("data_type", "int") != "int":
        raise CheckpointError(f"{path}: quantization_config key 'data_type' is {qcfg['data_type']!r}; humming_aot "
                              "loads auto-round's integer exports only (re-export as compressed-tensors)")
    if packing.endswith("auto_gptq") or packing == "auto_round":
        # auto-round writes GPTQ v1 tensors (zeros minus one), without g_idx
        return QuantConfig(schema="gptq", config={**qcfg, "checkpoint_format": "gptq"}, source=path)
    if packing.endswith("auto_awq"):
        return QuantConfig(schema="awq", config={**qcfg, "version": "gemm", "zero_point": True}, source=path)
    raise CheckpointError(f"{path}: quantization_config key 'packing_format' is {packing!r}; humming_aot loads "
                          "auto-round's 'auto_round:auto_gptq' and 'auto_round:auto_awq'")
