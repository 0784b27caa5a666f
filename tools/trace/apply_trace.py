"""Instrument a COPY of this tree with a per-warp timeline of the swapped 8-row mma.sync tile
(the M <= 8 kernels) and its split-K reduction in a cluster; tools/trace/trace_run.py reads it.

    mkdir /tmp/traced && git ls-files | tar -cf - -T - | tar -xf - -C /tmp/traced   # a copy
    python3 tools/trace/apply_trace.py /tmp/traced                                  # instrument it
    (cd /tmp/traced && python3 setup.py build_ext --inplace && python3 -m humming_aot build \
        --arch sm90a --catalog <small toml> --inplace && python3 tools/trace/trace_run.py out.npz int1:g128@1)

Never run it on the working tree: the instrumented kernels are slower and take the split-K
workspace pointer of clustered launches as the trace buffer (humming_aot.dispatch.TRACE_SLOTS,
one tensor per call, filled by trace_run.py). Lane 0 of each warp writes 20 u64 at
((blockIdx.y * gridDim.x + blockIdx.x) * warps + warp) * 20:
   0 SM id            1 globaltimer at start      2 globaltimer at end     3 clock64 at start
   4 prologue done (upstream grid waited for, activation copies issued)   5 first stage landed
   6 K loop done      7 K warps' shares gathered  8 end                    9 K tiles of the CTA
  10 share pushed (st.async issued)   11 owner: every slice's bytes in   12 owner: summed
  13-16 end of K tiles 0-3
The source anchors below are asserted: when the kernel changes, this script fails and names the
anchor to update (docs/performance/log.md section 17 has what the timeline showed).
"""
from anchors import copy_root
from anchors import patch as _patch

root = copy_root("apply_trace.py")
W = 20


def patch(path, pairs):
    _patch(root, path, pairs, "apply_trace.py")


helpers = '''namespace humming_aot::mainloop {

namespace trace {
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned long long ck() { unsigned long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned smid() { unsigned t; asm volatile("mov.u32 %0, %%smid;" : "=r"(t)); return t; }
}
'''
patch("csrc/include/humming_aot/mainloop/swapped_warp_pipeline.cuh", [
("namespace humming_aot::mainloop {\n", helpers),
# the trace slot and the start times live in the mainloop object: set before prepare() runs
('''  bool in_cluster_;  // the split-K reduction of this CTA runs inside its cluster''','''  unsigned long long t_gt0 = trace::gt(), t_c0 = trace::ck();
  unsigned long long* tr = nullptr;
  bool in_cluster_;  // the split-K reduction of this CTA runs inside its cluster'''),
('''      : in_cluster_(PartWriter::prepare(p, smem_base + kPipelineBytes, kWarps, warp)) {}''','''      : in_cluster_(PartWriter::prepare(p, smem_base + kPipelineBytes, kWarps, warp)) {
    if (p.workspace != nullptr && PartWriter::reduces_in_cluster(p))
      tr = reinterpret_cast<unsigned long long*>(p.workspace) + ((blockIdx.y * gridDim.x + blockIdx.x) * kWarps + warp) * %d;
  }''' % W),
('''    float acc[kMTiles][kNTiles][4];
    zero(acc);
''','''    unsigned long long t_pro = trace::ck(), t_first = 0, t_loop = 0, t_share = 0;
    float acc[kMTiles][kNTiles][4];
    zero(acc);
'''),
# the per-warp K loop is a function of its own: it gets the trace slot and the first stage's time
(''' const StepOffsets& offsets, int row_steps_mask,
                                                            Accumulators& acc) {''',''' const StepOffsets& offsets, int row_steps_mask,
                                                            Accumulators& acc, unsigned long long* tr, unsigned long long& t_first) {'''),
('''(loader, smem_base, count, offsets, 0, acc);''','''(loader, smem_base, count, offsets, 0, acc, tr, t_first);''', 3),
(''' int count, const StepOffsets& offsets, Accumulators& acc) {''',''' int count, const StepOffsets& offsets, Accumulators& acc,
                                                           unsigned long long* tr, unsigned long long& t_first) {'''),
('''(every_tile, loader, smem_base, count, offsets, acc);''','''(every_tile, loader, smem_base, count, offsets, acc, tr, t_first);''', 2),
('''(loader, smem_base, count, offsets, (1 << walk.step_shift) - 1, acc);''','''(loader, smem_base, count, offsets, (1 << walk.step_shift) - 1, acc, tr, t_first);'''),
('''        __syncwarp();                    // stage `it` landed for every lane of the warp, which alone reads its region''','''        __syncwarp();                    // stage `it` landed for every lane of the warp, which alone reads its region
        if (it == 0) t_first = trace::ck();'''),
('''          compute_stage<false>(stage_smem, offsets, row_steps_mask, acc);
        }''','''          compute_stage<false>(stage_smem, offsets, row_steps_mask, acc);
        }
        if (tr != nullptr && (threadIdx.x & 31) == 0 && it < 4) tr[13 + it] = trace::ck();'''),
('''    loop_done();
    memory::cp_async_wait<0>();''','''    t_loop = trace::ck();
    loop_done();
    memory::cp_async_wait<0>();'''),
('''      Reduction::share_over_k_warps(smem, warp_mn, warp_k, acc, share);
      const int col0''','''      Reduction::share_over_k_warps(smem, warp_mn, warp_k, acc, share);
      t_share = trace::ck();
      const int col0'''),
('''        Writer::write(stash.p, part, m0, n0 + warp_n * 64, tile_index, arrival_flag);
      }
    }
  }
};''','''        Writer::write(stash.p, part, m0, n0 + warp_n * 64, tile_index, arrival_flag);
      }
    }
    if (tr != nullptr && (threadIdx.x & 31) == 0) {
      const unsigned long long t_end = trace::ck(), g_end = trace::gt();
      tr[0] = trace::smid(); tr[1] = t_gt0; tr[2] = g_end; tr[3] = t_c0; tr[4] = t_pro; tr[5] = t_first;
      tr[6] = t_loop; tr[7] = t_share; tr[8] = t_end; tr[9] = count;
    }
  }
};'''),
])
CK = '{ unsigned long long t; asm volatile("mov.u64 %%0, %%%%clock64;" : "=l"(t)); tr[%d] = t; }'
patch("csrc/include/humming_aot/epilogue/swapped_output_writer.cuh", [
('''    if (owner != static_cast<int>(rank)) return true;  // warp-uniform''','''    unsigned long long* tr = stash.p.workspace == nullptr ? nullptr
        : reinterpret_cast<unsigned long long*>(stash.p.workspace) + ((blockIdx.y * gridDim.x + blockIdx.x) * (blockDim.x >> 5) + slot) * %d;
    if (tr != nullptr && lane == 0) %s
    if (owner != static_cast<int>(rank)) return true;  // warp-uniform''' % (W, CK % 10)),
('''    cluster::wait_byte_barrier(bar);''','''    cluster::wait_byte_barrier(bar);
    if (tr != nullptr && lane == 0) %s''' % (CK % 11)),
('''    for_each(token0, col0, [&](int j, int e, int token, int col) {
      if (token < target.m''','''    if (tr != nullptr && lane == 0) %s
    for_each(token0, col0, [&](int j, int e, int token, int col) {
      if (token < target.m''' % (CK % 12)),
])
patch("humming_aot/dispatch.py", [
('''        tensor_map = (None if self.dp_ctas is None''','''        if self.clustered and TRACE_SLOTS:
            workspace = TRACE_SLOTS.pop(0)
        tensor_map = (None if self.dp_ctas is None'''),
('''@functools.cache
def device_info''','''TRACE_SLOTS = []  # trace hack


@functools.cache
def device_info'''),
])
print(f"instrumented the swapped tile in {root}")
