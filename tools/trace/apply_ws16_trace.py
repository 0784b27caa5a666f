"""Instrument a COPY of this tree with per-unit clock64 stamps in the 16-bit-activation wgmma-ws
body (kernel/dense_wgmma_ws.cuh); tools/trace/ws16_trace_run.py runs it and prints each phase.

    mkdir /tmp/traced && git ls-files | tar -cf - -T - | tar -xf - -C /tmp/traced   # a copy
    python3 tools/trace/apply_ws16_trace.py /tmp/traced                             # instrument it
    (cd /tmp/traced && python3 setup.py build_ext --inplace && HUMMING_AOT_JIT=1 \
        python3 tools/trace/ws16_trace_run.py 4096x4096 64 [TILE])

Never run it on the working tree. The instrumented launcher passes humming_aot.dispatch.TRACE (an
int64 tensor the runner fills in) as GemmParams.w_zero_point where the weights have none (the
symmetric formats: the body never reads it then). Per CTA three rows of 8 + 32 * 8 u64, at
(blockIdx.x * 3 + row) * (8 + 32 * 8), row 0 and 1 written by thread 0 of consumer warpgroup 0 and
1, row 2 by the producer thread:
   header: 0 SM id   1 globaltimer at start   2 clock64 at start   3 globaltimer at end
           4 clock64 at end   5 units run (CTAs past 8192 write nothing; at most 32 units)
           6 (consumer rows) clock64 when the stream-K head's wait for its parts ended (a CTA
           holds at most one head: the unit its range ends inside), 0 for no head
   consumer unit (8 slots): 0 before its K loop   1 first K tile landed   2 K loop done
           3 stream-K fix-up done (publish or accumulate)   4 after the consumers' barrier
           5 tile stored   6 K tiles   7 flags: 1 a later part published, 2 a head that
           accumulated others' parts, 4 stored
   producer unit (8 slots): 0 before its copies   1 last copy issued   2 staging tile free
           (the ring may be refilled)   6 K tiles
The source anchors are asserted: when the body changes, this script fails and names the anchor.
"""
from anchors import copy_root
from anchors import patch as _patch

root = copy_root("apply_ws16_trace.py")


def patch(path, pairs):
    _patch(root, path, pairs, "apply_ws16_trace.py")


BODY = "csrc/include/humming_aot/kernel/dense_wgmma_ws.cuh"
# the head's wait for its parts' partials, stamped where it ends (header slot 6)
patch("csrc/include/humming_aot/epilogue/stream_k_fixup.cuh", [
("""namespace humming_aot::epilogue {
""",
"""namespace humming_aot::epilogue {
namespace ws16trace_fixup {
__shared__ unsigned long long waited;
}
"""),
("""      *counter = 0;  // every partial of the tile has counted itself: ready for the next launch
""",
"""      *counter = 0;  // every partial of the tile has counted itself: ready for the next launch
      { unsigned long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); ws16trace_fixup::waited = t; }
"""),
])
patch(BODY, [
("namespace humming_aot::kernel {\n", """namespace humming_aot::kernel {
namespace ws16trace {
__device__ __forceinline__ unsigned long long ck() { unsigned long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned smid() { unsigned t; asm volatile("mov.u32 %0, %%smid;" : "=r"(t)); return t; }
constexpr int kSlots = 8 + 32 * 8;
__shared__ unsigned long long first_landed[2];
__device__ __forceinline__ unsigned long long* row(const void* buffer, int r) {
  if (buffer == nullptr || blockIdx.x >= 8192) return nullptr;
  unsigned long long* t = reinterpret_cast<unsigned long long*>(const_cast<void*>(buffer)) + (blockIdx.x * 3 + r) * kSlots;
  t[0] = smid(); t[1] = gt(); t[2] = ck();
  return t;
}
}
"""),
("""    for (int it = 0; it < count; ++it) {
      ptx::mbarrier_wait(full0 + 8 * ring.slot, ring.full_parity);""",
"""    for (int it = 0; it < count; ++it) {
      ptx::mbarrier_wait(full0 + 8 * ring.slot, ring.full_parity);
      if (it == 0 && (threadIdx.x & 127) == 0) ws16trace::first_landed[threadIdx.x >> 7] = ws16trace::ck();"""),
("""        Units units(params);
        u32 fills = 0, staging_parity = 0;
        bool more = units.next(next);
        while (more) {
          unit = next;
          more = units.next(next);
          produce(p, params.a_map, unit.m_tile * kBlockM, unit.n_tile * kBlockN, unit.k_begin,
                  unit.k_end - unit.k_begin, smem_base, full0, empty0, fills);
          if (more && unit.k_begin == 0) {  // its tile is stored through the ring: wait for that
            ptx::mbarrier_wait(staging_barrier, staging_parity);
            staging_parity ^= 1u;
          }
        }
      }""",
"""        Units units(params);
        u32 fills = 0, staging_parity = 0;
        bool more = units.next(next);
        unsigned long long* tr = kHasZeroPoint ? nullptr : ws16trace::row(p.w_zero_point, 2);
        int ordinal = 0;
        while (more) {
          unit = next;
          more = units.next(next);
          unsigned long long* ts = (tr && ordinal < 32) ? tr + 8 + 8 * ordinal : nullptr;
          ++ordinal;
          if (ts) { ts[0] = ws16trace::ck(); ts[6] = unit.k_end - unit.k_begin; }
          produce(p, params.a_map, unit.m_tile * kBlockM, unit.n_tile * kBlockN, unit.k_begin,
                  unit.k_end - unit.k_begin, smem_base, full0, empty0, fills);
          if (ts) ts[1] = ws16trace::ck();
          if (more && unit.k_begin == 0) {  // its tile is stored through the ring: wait for that
            ptx::mbarrier_wait(staging_barrier, staging_parity);
            staging_parity ^= 1u;
          }
          if (ts) ts[2] = ws16trace::ck();
        }
        if (tr) { tr[3] = ws16trace::gt(); tr[4] = ws16trace::ck(); tr[5] = ordinal; }
      }"""),
("""    ConsumerRing ring;
    Units units(params);
    bool more = units.next(next);
    while (more) {
      unit = next;
      more = units.next(next);
      consume(unit.k_end - unit.k_begin, smem_base, full0, empty0, walk, ring, acc);""",
"""    ConsumerRing ring;
    Units units(params);
    bool more = units.next(next);
    unsigned long long* tr =
        (kHasZeroPoint || (threadIdx.x & 127) != 0) ? nullptr : ws16trace::row(p.w_zero_point, threadIdx.x >> 7);
    int ordinal = 0;
    unsigned long long* ts = nullptr;
    while (more) {
      unit = next;
      more = units.next(next);
      ts = (tr && ordinal < 32) ? tr + 8 + 8 * ordinal : nullptr;
      ++ordinal;
      if (tr) { tr[3] = ws16trace::gt(); tr[4] = ws16trace::ck(); tr[5] = ordinal; }
      if (ts) { ts[0] = ws16trace::ck(); ts[6] = unit.k_end - unit.k_begin; }
      consume(unit.k_end - unit.k_begin, smem_base, full0, empty0, walk, ring, acc);
      if (ts) { ts[1] = ws16trace::first_landed[threadIdx.x >> 7]; ts[2] = ws16trace::ck(); }"""),
("""          Fixup::publish(p, acc, blockIdx.x, p.tile_counters + unit.tile);
          continue;""",
"""          Fixup::publish(p, acc, blockIdx.x, p.tile_counters + unit.tile);
          if (ts) { ts[3] = ws16trace::ck(); ts[7] = 1; }
          if (tr) { tr[3] = ws16trace::gt(); tr[4] = ws16trace::ck(); }
          continue;"""),
("""          Fixup::accumulate(p, acc, blockIdx.x + 1, units.range.partials_of(unit.tile), p.tile_counters + unit.tile);
        }
      }
      ConsumerBarrier::sync();  // every consumer warpgroup is done with the ring: the staging tile reuses it""",
"""          Fixup::accumulate(p, acc, blockIdx.x + 1, units.range.partials_of(unit.tile), p.tile_counters + unit.tile);
          if (ts) ts[7] = 2;
          if (tr) tr[6] = epilogue::ws16trace_fixup::waited;
        }
      }
      if (ts) ts[3] = ws16trace::ck();
      ConsumerBarrier::sync();  // every consumer warpgroup is done with the ring: the staging tile reuses it
      if (ts) ts[4] = ws16trace::ck();"""),
("""      Writer::store_tile(p, acc, unit.m_tile * kBlockM, unit.n_tile * kBlockN, smem);""",
"""      Writer::store_tile(p, acc, unit.m_tile * kBlockM, unit.n_tile * kBlockN, smem);
      if (ts) { ts[5] = ws16trace::ck(); ts[7] |= 4; }
      if (tr) { tr[3] = ws16trace::gt(); tr[4] = ws16trace::ck(); }"""),
])
patch("humming_aot/dispatch.py", [
("0 if w_zero_point is None else w_zero_point.data_ptr(),",
 "(0 if TRACE is None else TRACE.data_ptr()) if w_zero_point is None else w_zero_point.data_ptr(),"),
])
s = (root / "humming_aot/dispatch.py").read_text()
(root / "humming_aot/dispatch.py").write_text(s + "\n\nTRACE = None\n")
print("instrumented", root)
