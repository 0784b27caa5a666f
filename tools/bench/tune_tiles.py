"""Sweep the installed catalog's tiles (and split-K factors) for one format and shape, timing each
with CUDA-graph replays over rotated inputs (humming_aot.testing.bench), and print which wins per M.

    python3 tools/bench/tune_tiles.py --shape 8192x8192 --m 1,16,64,256,1024,4096 --json tune.json
    python3 tools/bench/tune_tiles.py --shape 6144x4096,4096x14336 --m 64,128 --tiles wgmma-ws \
        --splits auto,tail,sk132,sk264

--splits options: auto (the dispatcher's choice), N (every tile cut in N K slices), tail (the
wgmma-ws tail split, no stream-K), skN (wgmma-ws stream-K over N persistent CTAs), sk (stream-K
over every CTA the device holds at once). --tiles: comma-separated label fragments, a tile is
tried if its label contains one of them; an entry that is a whole tile label (e.g.
wgmma-ws:176x256x64_w1x8_s4) is tried whether or not the installed catalog has it (the JIT builds
it: HUMMING_AOT_JIT=1).

The winners are what catalog/tiles.toml and heuristics.split_k_factor should choose; benchmarks
never assert, so this only reports.
"""
from __future__ import annotations

import argparse

import torch

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.catalog import installed_catalog
from humming_aot.spec import KernelKey
from humming_aot.testing.bench import buffer_sets_for_cold_l2, gemm_flops, tflops, time_cuda_graph, write_results_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8192x8192", help="NxK, or several separated by commas")
    parser.add_argument("--m", default="1,16,64,256,1024,4096")
    parser.add_argument("--format", default="int4:g128")
    parser.add_argument("--splits", default="auto,1,2,4,8,16", help="split-K / stream-K options to try for small M")
    parser.add_argument("--split-max-m", type=int, default=256, help="largest M that tries every --splits option")
    parser.add_argument("--tiles", default="", help="only tiles whose label contains one of these (comma list)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    results = []
    shapes = args.shape.split(",")
    for index, shape in enumerate(shapes):
        n, k = map(int, shape.split("x"))
        results += tune_shape(args, n, k)
        if args.json_path:  # after every shape, so that a run cut short by a time limit keeps its points
            write_results_json(args.json_path, results, format=args.format, complete=index == len(shapes) - 1)


def _full_label(text: str):
    """The tile a --tiles entry names in full (e.g. wgmma-ws:176x256x64_w1x8_s4), else None (a
    fragment, matched against the installed catalog's labels)."""
    from humming_aot.enumerate import parse_tile_field

    try:
        return parse_tile_field(text)
    except ValueError:
        return None


def _resident_capacity(packed, tile, m: int) -> int:
    """CTAs of `tile`'s kernel the current device holds at once (the largest stream-K grid)."""
    index = torch.cuda.current_device()
    info = dispatch.device_info(index)
    _, loaded = dispatch.obtain(ops.gemm_spec(packed), index, m, tile, packed.k, packed.group_size)
    return info.num_sms * dispatch._resident_ctas(loaded, tile, info)


def _split_option(option: str, packed=None, tile=None, m: int = 0) -> dict:
    """launch keywords of one --splits option"""
    if option == "auto":
        return {}
    if option == "tail":
        return {"stream_k": 0}
    if option == "sk":
        return {"stream_k": _resident_capacity(packed, tile, m)}
    if option.startswith("sk"):
        return {"stream_k": int(option[2:])}
    return {"splits": int(option)}


def candidate_tiles(catalog, arch: str, spec, wanted: list[str]) -> list:
    """The tiles to time, smallest first: the catalog's tiles of `spec` on `arch` whose label
    contains one of `wanted`, and every whole tile label among `wanted` (the JIT builds those). A
    `catalog` of None (none installed: a box with the JIT only) contributes nothing."""
    keys = [KernelKey.from_name(x) for x in catalog.keys_for(arch)] if catalog is not None else []
    tiles = {key.tile for key in keys if key.spec == spec and any(w in key.tile.label for w in wanted)}
    tiles |= {tile for tile in map(_full_label, wanted) if tile is not None}
    return sorted(tiles, key=lambda t: (t.block_m, t.block_n, t.stages))


def tune_shape(args, n: int, k: int) -> list[dict]:
    """Time every installed tile (and, up to --split-max-m, every --splits option) at each M."""
    act = torch.bfloat16
    packed0 = humming_aot.pack(humming_aot.quantize(torch.randn(n, k) * 0.02, args.format), act_dtype=act, device="cuda")
    spec = ops.gemm_spec(packed0)
    arch = dispatch.device_info(torch.cuda.current_device()).arches[0]
    tiles = candidate_tiles(installed_catalog(), arch, spec, args.tiles.split(","))
    results = []
    for m in map(int, args.m.split(",")):
        per_set = packed0.nbytes + m * k * 2
        sets = buffer_sets_for_cold_l2(per_set)
        weights = [packed0] + [
            humming_aot.pack(humming_aot.quantize(torch.randn(n, k) * 0.02, args.format), act_dtype=act, device="cuda")
            for _ in range(min(sets, 4) - 1)
        ]
        acts = [torch.randn(m, k, device="cuda", dtype=act) for _ in weights]
        best = None
        for tile in tiles:
            if tile.block_m > 4 * max(m, 16):
                continue
            split_options = args.splits.split(",") if m <= args.split_max_m else ["auto"]
            for split in split_options:
                try:
                    kwargs = _split_option(split, packed0, tile, m)
                    fns = [(lambda a=a, w=w: ops.gemm_with_tile(a, w, tile, **kwargs)) for a, w in zip(acts, weights)]
                    timing = time_cuda_graph(fns, repeats=args.repeats)
                except Exception as error:  # a combination the kernel rejects: report and go on
                    print(f"{n}x{k} m={m} {tile.label} splits={split}: {type(error).__name__}: {error}")
                    continue
                row = {"m": m, "n": n, "k": k, "tile": tile.label, "splits": split, "us": timing["median_us"],
                       "tflops": tflops(gemm_flops(m, n, k), timing["median_us"])}
                results.append(row)
                if best is None or row["us"] < best["us"]:
                    best = row
                print(f"{n}x{k} m={m:5d} {tile.label:30s} splits={split:>6s} {row['us']:9.2f} us "
                      f"{row['tflops']:7.1f} TFLOP/s", flush=True)
        if best:
            print(f"BEST {n}x{k} m={m}: {best['tile']} splits={best['splits']} {best['us']:.2f} us", flush=True)
    return results

if __name__ == "__main__":
    main()
