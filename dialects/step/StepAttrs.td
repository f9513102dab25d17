//===- StepAttrs.td - Attributes of the step dialect -------*- tablegen -*-===//
#ifndef STEP_ATTRS_TD
#define STEP_ATTRS_TD

include "StepDialect.td"
include "mlir/IR/AttrTypeBase.td"

def Step_PlanAttr : AttrDef<Step_Dialect, "Plan"> {
  let mnemonic = "plan";
  let summary = "the static memory plan of a step";
  let description = [{
    Attached to a planned step function as `step.plan`. `arena_bytes` is the
    size of the one arena every `step.buffer` of the step lives in (each
    buffer's `at` offset plus its size is at most this); `alignment` is the
    alignment of every offset; `peak_live_bytes` is the most bytes of
    buffers live at any one op, the lower bound any plan of this step needs
    (so `arena_bytes / peak_live_bytes` says how close the plan came);
    `buffers` counts the arena buffers.

    Example:
    ```mlir
    func.func @decode_step() attributes {step.plan = #step.plan<arena_bytes = 9216, peak_live_bytes = 8704, alignment = 256, buffers = 41>}
    ```
  }];
  let parameters = (ins "int64_t":$arena_bytes, "int64_t":$peak_live_bytes,
                        "int64_t":$alignment, "int64_t":$buffers);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

#endif // STEP_ATTRS_TD
