"""Triton kernels and their launchers, by family. Importing this never queries the device."""

# Every module listed here exposes ``aot_specs(target)``; scripts/aot_check.py compiles them all.
KERNEL_MODULES: tuple[str, ...] = (
    "primus_turbo.triton.attention.attn_launch",
    "primus_turbo.triton.gemm.gemm_kernel",
    "primus_turbo.triton.grouped_gemm.grouped_gemm_kernel",
    "primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma",
    "primus_turbo.triton.activation.glu_kernel",
    "primus_turbo.triton.moe.permute_kernel",
    "primus_turbo.triton.moe.route_map_kernel",
    "primus_turbo.triton.moe.permute_v2_kernel",
    "primus_turbo.triton.moe.router_kernel",
    "primus_turbo.triton.normalization.rmsnorm_kernel",
    "primus_turbo.triton.quantization.quant_kernel",
    "primus_turbo.triton.quantization.quant_kernel_v2",
    "primus_turbo.triton.quantization.quant_dual",
    "primus_turbo.triton.quantization.quant_words",
    "primus_turbo.triton.quantization.quant_tensorwise",
    "primus_turbo.triton.gemm.gemm_fp8_kernel",
    "primus_turbo.triton.gemm.gemm_mx_kernel",
)
