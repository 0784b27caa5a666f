"""CUDA targets: which catalog arches can serve a GPU, and the nvcc flags that build one.

Binary compatibility (CUDA programming guide, "Binary Compatibility"): SASS built for sm_XY runs
on devices of compute capability X.Z with Z >= Y. An arch-specific target (``sm90a``) uses
instructions of exactly one compute capability and runs only there. Family targets (``sm100f``)
are accepted by ``nvcc_gencode`` but not served yet: no catalog builds them.

We ship SASS only, never PTX: PTX from a newer toolkit is refused by an older driver
(CUDA_ERROR_UNSUPPORTED_PTX_VERSION), and the JIT fallback covers what SASS does not.
"""
from __future__ import annotations

from humming_aot.spec import parse_arch

# Real targets nvcc 13.0 can build (`nvcc --list-gpu-code`), minus the Jetson parts (sm87, sm88)
# whose SASS we have no reason to serve to desktop/datacenter GPUs.
PLAIN_TARGETS = (75, 80, 86, 89, 90, 100, 103, 110, 120, 121)
# Compute capabilities with arch-specific ('a') and family ('f') feature sets.
SPECIFIC_TARGETS = (90, 100, 103, 110, 120, 121)
FAMILY_TARGETS = (100, 103, 110, 120, 121)


def validate_target(arch: str) -> str:
    """Return ``arch`` if it names a target nvcc can build SASS for; else ValueError saying which are."""
    number, suffix = parse_arch(arch)
    allowed = {"": PLAIN_TARGETS, "a": SPECIFIC_TARGETS, "f": FAMILY_TARGETS}[suffix]
    if number not in allowed:
        raise ValueError(
            f"arch {arch!r} is not a target humming_aot builds: use one of {', '.join(known_targets())}"
        )
    return arch


def known_targets() -> list[str]:
    """Every target name ``validate_target`` accepts, in numeric order."""
    names = [(n, 0, f"sm{n}") for n in PLAIN_TARGETS]
    names += [(n, 1, f"sm{n}a") for n in SPECIFIC_TARGETS]
    names += [(n, 2, f"sm{n}f") for n in FAMILY_TARGETS]
    return [name for _, _, name in sorted(names)]


def capability(arch: str) -> tuple[int, int]:
    """'sm90a' -> (9, 0); 'sm121' -> (12, 1)."""
    number, _ = parse_arch(arch)
    return number // 10, number % 10


def archs_for_capability(major: int, minor: int) -> list[str]:
    """Catalog arch names whose SASS runs on a GPU of compute capability major.minor, best first.

    The exact arch-specific target first (it may use instructions the others cannot), then plain
    targets of the same major from the exact minor downwards:
    9.0 -> [sm90a, sm90]; 8.9 -> [sm89, sm86, sm80]; 12.1 -> [sm121a, sm121, sm120].
    """
    number = major * 10 + minor
    archs = [f"sm{number}a"] if number in SPECIFIC_TARGETS else []
    plain = [n for n in PLAIN_TARGETS if n // 10 == major and n <= number]
    archs += [f"sm{n}" for n in sorted(plain, reverse=True)]
    return archs


def serving_arches(capability: tuple[int, int]) -> list[str]:
    """``archs_for_capability`` for a (major, minor) tuple, as torch.cuda.get_device_capability gives it."""
    return archs_for_capability(*capability)


def serving_arch(available: list[str] | set[str] | tuple[str, ...], major: int, minor: int) -> str | None:
    """The best of ``available`` (catalog arches) for a GPU of capability major.minor, or None."""
    for arch in archs_for_capability(major, minor):
        if arch in available:
            return arch
    return None


def nvcc_gencode(arch: str) -> list[str]:
    """The nvcc flags that emit SASS (and no PTX) for one target: sm90a ->
    ['-gencode=arch=compute_90a,code=sm_90a']."""
    validate_target(arch)
    number, suffix = parse_arch(arch)
    return [f"-gencode=arch=compute_{number}{suffix},code=sm_{number}{suffix}"]
