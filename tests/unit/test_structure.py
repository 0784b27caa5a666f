"""The package's import structure: the run time (ops, dispatch, nn, catalog, kernels, obtain, the
JIT, the checkpoint loaders) never imports the build package humming_aot.aot, and no two
humming_aot modules import each other at module level, directly or through others."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "humming_aot"

RUN_TIME = """
import sys, torch
import humming_aot
from humming_aot import catalog, checkpoints, dispatch, jit, kernels, nn, obtain, ops
from humming_aot.spec import KernelKey
w = humming_aot.pack(humming_aot.quantize(torch.randn(128, 256), "int4:g128"), act_dtype=torch.bfloat16)
out = ops.gemm(torch.randn(3, 256).bfloat16(), w)  # the CPU reference path
layer = nn.QuantizedLinear.from_linear(torch.nn.Linear(256, 128), "uint4:g64:zp")
layer(torch.randn(2, 256).to(layer.w_scale.dtype))
obtain.build_hint(KernelKey.from_name("gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x64_w1x2_s4"))
catalog.test_keys("sm90a", "smoke")
loaded = sorted(name for name in sys.modules if name == "humming_aot.aot" or name.startswith("humming_aot.aot."))
print("AOT:", ",".join(loaded))
"""


def test_the_run_time_does_not_import_the_build_package():
    result = subprocess.run([sys.executable, "-c", RUN_TIME], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("AOT:")]
    assert line.strip() == "AOT:", f"the run time imported {line[4:]}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path, modules: set[str]) -> set[str]:
    """humming_aot modules `path` imports when it is imported: top-level statements and the bodies
    of top-level if/try blocks, except `if TYPE_CHECKING:` (function bodies run later)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)

    visit(ast.parse(path.read_text()).body)
    return {module for module in found if module in modules and module != name}


def test_no_import_cycles_among_the_package_modules():
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: _module_level_imports(path, set(paths)) for name, path in paths.items()}
    # a package's __init__ imported by its own submodule is Python's normal order, not a cycle
    for name in graph:
        graph[name] = {dep for dep in graph[name] if not name.startswith(dep + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = walk(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = walk(node)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


MAX_LINES = 600  # docs/style.md: past this a file holds more than one job


def test_no_source_file_is_over_600_lines():
    sources = [path for root in ("humming_aot", "csrc", "tools", "tests") for path in (REPO / root).rglob("*")
               if path.suffix in (".py", ".cuh", ".cu", ".cpp", ".h", ".sh") and path.is_file()]
    assert len(sources) > 100, "the walk found the sources"
    long = {str(path.relative_to(REPO)): n for path in sources
            if (n := len(path.read_text(errors="replace").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by job): {long}"
