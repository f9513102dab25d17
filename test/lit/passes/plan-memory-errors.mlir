// RUN: kiln-opt %s --split-input-file --allow-unregistered-dialect --kiln-plan-memory --verify-diagnostics
// RUN: not kiln-opt %s --allow-unregistered-dialect --kiln-plan-memory=alignment=48 2>&1 | FileCheck %s --check-prefix=ALIGN
// RUN: not kiln-opt %s --allow-unregistered-dialect --kiln-plan-memory=reuse-distance=-1 2>&1 | FileCheck %s --check-prefix=HOLD

// The planner refuses what it cannot see: an op with unknown effects on an
// arena buffer (it cannot know when the buffer is live) and an alignment
// that is not a power of two.

func.func @opaque_kernel() {
  %a = step.buffer "a" : memref<16xf32>
  // expected-error @+1 {{'vendor.kernel' op has unknown memory effects on %a; cannot plan this step}}
  "vendor.kernel"(%a) : (memref<16xf32>) -> ()
  return
}

// ALIGN: error: kiln-plan-memory: alignment must be a power of two, got 48
// HOLD: error: kiln-plan-memory: reuse-distance must not be negative, got -1
