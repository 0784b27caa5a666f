"""Instrument a COPY of this tree with per-unit clock64 stamps in the W8A8 / W4A8 bodies' driver
(kernel/scaled_ws_driver.cuh); tools/trace/ws_trace_run.py runs it and prints each phase.

    mkdir /tmp/traced && git ls-files | tar -cf - -T - | tar -xf - -C /tmp/traced   # a copy
    python3 tools/trace/apply_ws_trace.py /tmp/traced                               # instrument it
    (cd /tmp/traced && python3 setup.py build_ext --inplace && HUMMING_AOT_JIT=1 \
        python3 /path/to/tools/trace/ws_trace_run.py w8a8 6144x4096 8192)

Never run it on the working tree. The instrumented launcher passes humming_aot._w8a8_launch.TRACE
(an int64 tensor the runner fills in) as GemmParams.w_zero_point, which these bodies do not read.
Thread 0 of each consumer warpgroup writes, at (blockIdx.x * 2 + warpgroup) * (8 + 64 * 6):
   0 SM id   1 globaltimer at start   2 clock64 at start   3 globaltimer at end   4 clock64 at end
   5 units run (CTAs past 8192 write nothing); then per unit (at most 64), 6 slots: 0 before its K loop, 1 after it, 2 after
   the consumers' barrier, 3 after scale_sums, 4 after the staging tile's store, 5 its K tiles.
The source anchors are asserted: when the driver changes, this script fails and names the anchor.
(docs/performance/log.md section 38 has what the trace showed.)
"""
from anchors import copy_root
from anchors import patch as _patch

root = copy_root("apply_ws_trace.py")


def patch(path, pairs):
    _patch(root, path, pairs, "apply_ws_trace.py")



patch("csrc/include/humming_aot/kernel/scaled_ws_driver.cuh", [
("namespace humming_aot::kernel {\n", """namespace humming_aot::kernel {
namespace wstrace {
__device__ __forceinline__ unsigned long long ck() { unsigned long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned smid() { unsigned t; asm volatile("mov.u32 %0, %%smid;" : "=r"(t)); return t; }
}
"""),
("""    float acc[Body::kAccumulators];
    typename Body::ConsumerState ring;
    Units units(tma);
    bool more = units.next(next);
    while (more) {
      unit = next;
      more = units.next(next);""", """    float acc[Body::kAccumulators];
    typename Body::ConsumerState ring;
    Units units(tma);
    bool more = units.next(next);
    unsigned long long* tr = nullptr;
    const bool tracer = (threadIdx.x & 127) == 0 && blockIdx.x < 8192 && p.w_zero_point != nullptr;
    if (tracer) {
      tr = reinterpret_cast<unsigned long long*>(const_cast<void*>(p.w_zero_point)) + (blockIdx.x * 2 + (threadIdx.x >> 7)) * (8 + 64 * 6);
      tr[0] = wstrace::smid(); tr[1] = wstrace::gt(); tr[2] = wstrace::ck();
    }
    int ordinal = 0;
    unsigned long long* ts = nullptr;
    while (more) {
      unit = next;
      more = units.next(next);
      ts = (tracer && ordinal < 64) ? tr + 8 + 6 * ordinal : nullptr;
      ++ordinal;
      if (ts) { ts[0] = wstrace::ck(); ts[5] = unit.k_end - unit.k_begin; }"""),
("""      if (!more) schedule::release_dependent_grid();
      if (units.stream_k) {""", """      if (ts) ts[1] = wstrace::ck();
      if (!more) schedule::release_dependent_grid();
      if (units.stream_k) {"""),
("""      Body::scale_sums(params, acc, m0, n0);
      Body::Writer::store_tile(p, acc, m0, n0, smem + Body::kStagingOffset);""", """      if (ts) ts[2] = wstrace::ck();
      Body::scale_sums(params, acc, m0, n0);
      if (ts) ts[3] = wstrace::ck();
      Body::Writer::store_tile(p, acc, m0, n0, smem + Body::kStagingOffset);
      if (ts) ts[4] = wstrace::ck();"""),
("""        if (threadIdx.x == 0) ptx::mbarrier_arrive(staging_barrier);
      }
    }""", """        if (threadIdx.x == 0) ptx::mbarrier_arrive(staging_barrier);
      }
    }
    if (tracer) { tr[3] = wstrace::gt(); tr[4] = wstrace::ck(); tr[5] = ordinal; }"""),
])
patch("humming_aot/_w8a8_launch.py", [
("codes.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), 0, ",
 "codes.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), 0 if TRACE is None else TRACE.data_ptr(), "),
])
s = (root / "humming_aot/_w8a8_launch.py").read_text()
(root / "humming_aot/_w8a8_launch.py").write_text(s + "\n\nTRACE = None\n")
print("instrumented", root)
