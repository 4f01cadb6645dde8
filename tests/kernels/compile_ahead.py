"""Compile every kernel variant for sm80 and sm90 on this CPU; print one JSON line per build.

Run as a script in a process without ``TRITON_INTERPRET`` (see ``test_kernel_compile.py``).
Each line: ``{"kernel", "dtype", "variant", "arch", "cubin", "ptx"}`` with the sizes in bytes.
"""

from __future__ import annotations

import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lightning_losses.kernels import linear_head, mbls
from lightning_losses.kernels.target_probability import kernel

ROWS = {"rows": "i32", "columns": "i32", "stride": "i32"}
FORWARD = {
    "logits_ptr": "{dtype}",
    "target_ptr": "*i64",
    "weight_ptr": "*fp32",
    "lse_ptr": "*fp32",
    "log_p_ptr": "*fp32",
    "smooth_ptr": "*fp32",
    "runner_up_ptr": "*fp32",
    "runner_up_index_ptr": "*i64",
    **ROWS,
    "total_ptr": "*fp32",
}
BACKWARD = {
    "logits_ptr": "{dtype}",
    "target_ptr": "*i64",
    "weight_ptr": "*fp32",
    "lse_ptr": "*fp32",
    "scale_ptr": "*fp32",
    "h_ptr": "*fp32",
    "second_ptr": "*i64",
    "second_scale_ptr": "*fp32",
    "grad_ptr": "{dtype}",
    **ROWS,
    "grad_stride": "i32",
    "total_ptr": "*fp32",
}
#: (name, signature, flag variants: the constexpr switches, all off and all on)
KERNELS = [
    (
        "forward",
        FORWARD,
        [dict.fromkeys(("HAS_WEIGHT", "SMOOTHING", "RUNNER_UP"), on) for on in (False, True)],
    ),
    (
        "backward",
        BACKWARD,
        [dict.fromkeys(("HAS_WEIGHT", "SMOOTHING", "SECOND"), on) for on in (False, True)],
    ),
]
#: (BLOCK_N, BLOCK_C, num_warps) of a short-row and a long-row launch
BLOCKS = [(4, 1024, 4), (1, 4096, 8)]
MBLS_FORWARD = {
    "logits_ptr": "{dtype}",
    "target_ptr": "*i64",
    "lse_ptr": "*fp32",
    "log_p_ptr": "*fp32",
    "maximum_ptr": "*fp32",
    "argmax_ptr": "*i64",
    "hinge_ptr": "*fp32",
    "count_ptr": "*fp32",
    **ROWS,
    "margin": "fp32",
}
MBLS_BACKWARD = {
    "logits_ptr": "{dtype}",
    "target_ptr": "*i64",
    "lse_ptr": "*fp32",
    "maximum_ptr": "*fp32",
    "argmax_ptr": "*i64",
    "count_ptr": "*fp32",
    "g_ptr": "*fp32",
    "h_ptr": "*fp32",
    "grad_ptr": "{dtype}",
    **ROWS,
    "grad_stride": "i32",
    "margin": "fp32",
}
#: MbLS's kernels (no constexpr switches): float32 with the short-row blocks, bfloat16 with the
#: long-row ones (float16 is bfloat16's code but for the load's type: left out for time)
MBLS_KERNELS = [("mbls_forward", MBLS_FORWARD), ("mbls_backward", MBLS_BACKWARD)]


def _build(fn: object, signature: dict[str, str], constexprs: dict, arch: int, warps: int) -> dict:
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps}
    )
    return {"arch": arch, "cubin": len(compiled.asm["cubin"]), "ptx": len(compiled.asm["ptx"])}


#: The linear head's kernels (lightning_losses/kernels/linear_head.py): logits of each dtype.
HEAD_STATISTICS = {
    "logits_ptr": "{dtype}",
    "bias_ptr": "*fp32",
    "weight_ptr": "*fp32",
    "target_ptr": "*i64",
    "lse_ptr": "*fp32",
    "target_logit_ptr": "*fp32",
    "smooth_ptr": "*fp32",
    "total_ptr": "*fp32",
    **ROWS,
}
HEAD_GRADIENT = {
    "logits_ptr": "{dtype}",
    "bias_ptr": "*fp32",
    "weight_ptr": "*fp32",
    "target_ptr": "*i64",
    "lse_ptr": "*fp32",
    "a_ptr": "*fp32",
    "b_ptr": "*fp32",
    "g_ptr": "*fp32",
    "grad_ptr": "{dtype}",
    **ROWS,
    "grad_stride": "i32",
}
HEAD_FLAGS = ("HAS_BIAS", "HAS_WEIGHT", "SMOOTHING")
#: (dtype, all flags on): float32 with the flags off and on, the half dtypes with them on (the
#: head's chunks are long rows: one launch shape, a row of 4096 columns per step)
HEAD_BUILDS = [("*fp32", False), ("*fp32", True), ("*bf16", True), ("*fp16", True)]


def compile_head() -> None:
    """Compile the head's two kernels for each of :data:`HEAD_BUILDS` and architecture."""
    for name, signature in (("statistics", HEAD_STATISTICS), ("gradient", HEAD_GRADIENT)):
        fn = linear_head.kernel(name, interpret=False)
        for dtype, on in HEAD_BUILDS:
            constexprs = {**dict.fromkeys(HEAD_FLAGS, on), "BLOCK_N": 1, "BLOCK_C": 4096}
            full = {k: v.format(dtype=dtype) for k, v in signature.items()}
            full.update(dict.fromkeys(constexprs, "constexpr"))
            for arch in (80, 90):
                source = ASTSource(fn=fn, signature=full, constexprs=constexprs)
                compiled = triton.compile(
                    source, target=GPUTarget("cuda", arch, 32), options={"num_warps": 8}
                )
                line = {
                    "kernel": f"head_{name}",
                    "dtype": dtype,
                    "variant": "all on" if on else "all off",
                    "arch": arch,
                    "cubin": len(compiled.asm["cubin"]),
                    "ptx": len(compiled.asm["ptx"]),
                }
                print(json.dumps(line), flush=True)


def main() -> None:
    """Compile each kernel x dtype x variant x architecture and print its sizes."""
    for name, signature, variants in KERNELS:
        fn = kernel(name, interpret=False)
        for dtype in ("*fp32", "*bf16", "*fp16"):
            for index, flags in enumerate(variants):
                block_n, block_c, num_warps = BLOCKS[index]
                constexprs = {**flags, "BLOCK_N": block_n, "BLOCK_C": block_c}
                full = {k: v.format(dtype=dtype) for k, v in signature.items()}
                full.update(dict.fromkeys(constexprs, "constexpr"))
                for arch in (80, 90):
                    line = {
                        "kernel": name,
                        "dtype": dtype,
                        "variant": "all on" if index else "all off",
                        **_build(fn, full, constexprs, arch, num_warps),
                    }
                    print(json.dumps(line), flush=True)
    for name, signature in MBLS_KERNELS:
        fn = mbls.kernel(name, interpret=False)
        for dtype in ("*fp32", "*bf16"):
            block_n, block_c, num_warps = BLOCKS[0 if dtype == "*fp32" else 1]
            constexprs = {"BLOCK_N": block_n, "BLOCK_C": block_c}
            full = {k: v.format(dtype=dtype) for k, v in signature.items()}
            full.update(dict.fromkeys(constexprs, "constexpr"))
            for arch in (80, 90):
                line = {
                    "kernel": name,
                    "dtype": dtype,
                    "variant": f"BLOCK {block_n}x{block_c}",
                    **_build(fn, full, constexprs, arch, num_warps),
                }
                print(json.dumps(line), flush=True)
    compile_head()


if __name__ == "__main__":
    sys.exit(main())
