"""Build-time machinery: enumerator, codegen, nvcc/ninja driver, manifest and wheel assembly."""
