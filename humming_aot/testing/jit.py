"""Why a test run cannot use the NVRTC fallback, for the GPU tests that need it (they skip with
the reason)."""
from __future__ import annotations


def why_no_jit(when_off: str, for_what: str) -> str | None:
    """None when the JIT is on and NVRTC loads; else the reason: "HUMMING_AOT_JIT=0: <when_off>"
    or "no usable NVRTC <for_what>: <the loader's error>"."""
    from humming_aot import env
    from humming_aot.jit import nvrtc

    if not env.jit_enabled():
        return f"HUMMING_AOT_JIT=0: {when_off}"
    try:
        nvrtc.load_nvrtc()
    except (nvrtc.NvrtcNotFoundError, nvrtc.NvrtcError) as e:
        return f"no usable NVRTC {for_what}: {e}"
    return None
