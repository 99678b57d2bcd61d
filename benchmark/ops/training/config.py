"""Named model configs and the shape lists the training-op benchmarks run (data only).

* Dense GEMM: per model, ``[M = seqlen * MBS, N, K]`` for the projections of one layer
  (``b`` is the ``[N, K]`` weight): QKV, attention out, MLP gate+up, MLP down, and the LM head.
  DeepSeek-V3's MLA attention contributes its low-rank projections instead of a fused QKV.
* CPU profile: a few tiny shapes so ``make bench`` on a CPU finishes in well under a minute.
* MoE: per model the expert counts and widths for the grouped-GEMM benchmarks (later ops).

Sources: the models' published ``config.json`` files; ``shared/reference/primus_api.md`` 5.1.
"""

from __future__ import annotations

import dataclasses

DEFAULT_MBS = 1


@dataclasses.dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention widths."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclasses.dataclass(frozen=True)
class DenseModel:
    """The dense (non-expert) GEMM-relevant widths of one model.

    ``intermediate`` is the dense MLP width; ``None`` for models whose every MLP is MoE.
    """

    name: str
    seqlen: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int | None
    mla: MLA | None = None
    source: str = ""

    def gemm_layers(self) -> list[tuple[str, int, int]]:
        """``(layer, N, K)`` of each dense projection (weight ``[N, K]``)."""
        h = self.hidden
        layers: list[tuple[str, int, int]] = []
        if self.mla is None:
            qkv = (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
            layers.append(("qkv", qkv, h))
            layers.append(("attn_out", h, self.num_q_heads * self.head_dim))
        else:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            layers.append(("q_a", m.q_lora_rank, h))
            layers.append(("kv_a", m.kv_lora_rank + m.qk_rope_head_dim, h))
            layers.append(("q_b", self.num_q_heads * qk, m.q_lora_rank))
            kv_b = self.num_q_heads * (m.qk_nope_head_dim + m.v_head_dim)
            layers.append(("kv_b", kv_b, m.kv_lora_rank))
            layers.append(("attn_out", h, self.num_q_heads * m.v_head_dim))
        if self.intermediate is not None:
            layers.append(("gate_up", 2 * self.intermediate, h))
            layers.append(("down", h, self.intermediate))
        layers.append(("lm_head", self.vocab, h))
        return layers


DENSE_MODELS: dict[str, DenseModel] = {
    m.name: m
    for m in (
        DenseModel(
            "Llama-3.1-8B",
            seqlen=8192,
            hidden=4096,
            num_q_heads=32,
            num_kv_heads=8,
            head_dim=128,
            vocab=128256,
            intermediate=14336,
            source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
        ),
        DenseModel(
            "Llama-3-70B",
            seqlen=8192,
            hidden=8192,
            num_q_heads=64,
            num_kv_heads=8,
            head_dim=128,
            vocab=128256,
            intermediate=28672,
            source="https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json",
        ),
        DenseModel(
            "Qwen2.5-72B",
            seqlen=8192,
            hidden=8192,
            num_q_heads=64,
            num_kv_heads=8,
            head_dim=128,
            vocab=152064,
            intermediate=29568,
            source="https://huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json",
        ),
        # The first 3 layers of DeepSeek-V3 are dense (MLP width 18432); attention is MLA.
        DenseModel(
            "DeepSeek-V3",
            seqlen=4096,
            hidden=7168,
            num_q_heads=128,
            num_kv_heads=128,
            head_dim=192,
            vocab=129280,
            intermediate=18432,
            mla=MLA(
                q_lora_rank=1536,
                kv_lora_rank=512,
                qk_nope_head_dim=128,
                qk_rope_head_dim=64,
                v_head_dim=128,
            ),
            source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
        ),
        # gpt-oss-20b and -120b share the attention widths; every MLP is MoE (see MOE_MODELS).
        DenseModel(
            "gpt-oss",
            seqlen=4096,
            hidden=2880,
            num_q_heads=64,
            num_kv_heads=8,
            head_dim=64,
            vocab=201088,
            intermediate=None,
            source="https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class GemmCase:
    """One dense GEMM: ``[M, K] x [N, K]^T`` for ``case``'s ``layer`` at micro-batch ``mbs``."""

    case: str
    layer: str
    mbs: int
    m: int
    n: int
    k: int

    @property
    def label(self) -> str:
        return f"{self.case}-{self.layer}"


# Tiny shapes for the CPU profile (exercise every code path, finish in seconds). Odd sizes
# check the masked edges; 256 is the largest so the whole profile stays well under a minute.
CPU_GEMM_SHAPES: tuple[tuple[str, int, int, int], ...] = (
    ("square64", 64, 64, 64),
    ("square128", 128, 128, 128),
    ("qkv-like", 128, 192, 64),
    ("down-like", 64, 128, 256),
    ("odd", 96, 80, 144),
)


def dense_gemm_cases(
    models: list[str] | None = None, mbs: int = DEFAULT_MBS, profile: str = "gpu"
) -> list[GemmCase]:
    """The dense GEMM cases of ``models`` (all when ``None``) for ``profile`` ("gpu"/"cpu")."""
    if profile == "cpu":
        return [GemmCase("cpu", lbl, 1, m, n, k) for lbl, m, n, k in CPU_GEMM_SHAPES]
    names = list(DENSE_MODELS) if not models else models
    unknown = [n for n in names if n not in DENSE_MODELS]
    if unknown:
        raise ValueError(f"--models expected names in {sorted(DENSE_MODELS)}, got {unknown}")
    return [
        GemmCase(name, layer, mbs, DENSE_MODELS[name].seqlen * mbs, n, k)
        for name in names
        for layer, n, k in DENSE_MODELS[name].gemm_layers()
    ]


# ------------------------------------------------------------------------------------------
# MoE (grouped GEMM) data for later ops
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MoEModel:
    """Routed-expert widths of one MoE model."""

    name: str
    num_experts: int
    topk: int
    hidden: int
    moe_intermediate: int
    seqlen: int
    source: str = ""

    def expert_layers(self) -> list[tuple[str, int, int]]:
        """``(layer, N, K)`` of the per-expert GEMMs (weights ``[E, N, K]``)."""
        return [
            ("gate_up", 2 * self.moe_intermediate, self.hidden),
            ("down", self.hidden, self.moe_intermediate),
        ]


MOE_MODELS: dict[str, MoEModel] = {
    m.name: m
    for m in (
        MoEModel(
            "DeepSeek-V3",
            256,
            8,
            7168,
            2048,
            4096,
            "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
        ),
        # Qwen3 moe_intermediate from the published configs (768 / 1536). The upstream Primus
        # shape table uses 2048 / 4096 for these two; add those explicitly if comparing with it.
        MoEModel(
            "Qwen3-30B-A3B",
            128,
            8,
            2048,
            768,
            8192,
            "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
        ),
        MoEModel(
            "Qwen3-235B-A22B",
            128,
            8,
            4096,
            1536,
            8192,
            "https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json",
        ),
        MoEModel(
            "gpt-oss-20b",
            32,
            4,
            2880,
            2880,
            4096,
            "https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json",
        ),
        MoEModel(
            "gpt-oss-120b",
            128,
            4,
            2880,
            2880,
            4096,
            "https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json",
        ),
        MoEModel(
            "Mixtral-8x7B",
            8,
            2,
            4096,
            14336,
            4096,
            "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
        ),
        MoEModel(
            "Mixtral-8x22B",
            8,
            2,
            6144,
            16384,
            8192,
            "https://huggingface.co/mistralai/Mixtral-8x22B-v0.1/blob/main/config.json",
        ),
    )
}

GROUPED_GEMM_EP_SIZES: tuple[int, ...] = (32, 16, 8)
GROUPED_GEMM_TOKENS_PER_EXPERT: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)


@dataclasses.dataclass(frozen=True)
class GroupedGemmCase:
    """``B`` experts on one rank, ``M`` tokens each (balanced), weights ``[B, N, K]``."""

    case: str
    layer: str
    ep: int
    b: int
    m: int
    n: int
    k: int


def grouped_gemm_cases(
    models: list[str] | None = None,
    ep_sizes: tuple[int, ...] = GROUPED_GEMM_EP_SIZES,
    tokens_per_expert: tuple[int, ...] = GROUPED_GEMM_TOKENS_PER_EXPERT,
) -> list[GroupedGemmCase]:
    """Grouped GEMM cases: for each EP size dividing the expert count (``B = E / EP`` experts
    per rank; when E < every EP size, all experts on one rank), each M and each expert layer."""
    names = list(MOE_MODELS) if not models else models
    unknown = [n for n in names if n not in MOE_MODELS]
    if unknown:
        raise ValueError(f"--models expected names in {sorted(MOE_MODELS)}, got {unknown}")
    cases = []
    for name in names:
        cfg = MOE_MODELS[name]
        eps = [ep for ep in ep_sizes if cfg.num_experts % ep == 0] or [cfg.num_experts]
        for ep in eps:
            for m in tokens_per_expert:
                for layer, n, k in cfg.expert_layers():
                    cases.append(GroupedGemmCase(name, layer, ep, cfg.num_experts // ep, m, n, k))
    return cases


# ------------------------------------------------------------------------------------------
# Grouped GEMM with realistic, non-uniform group sizes (bench_grouped_gemm_turbo.py)
# ------------------------------------------------------------------------------------------
def moe_group_lens(
    total: int, groups: int, seed: int, shape: float = 3.0, zero_every: int = 16
) -> list[int]:
    """Seeded non-uniform rows per expert summing to ``total``.

    Expert loads are Gamma(``shape``)-distributed (shape 3: coefficient of variation ~0.58, the
    imbalance a router shows with an aux loss), one expert in ``zero_every`` gets no tokens, and
    the rounding remainder goes to the busiest expert.
    """
    import random

    rng = random.Random(seed)
    weights = [rng.gammavariate(shape, 1.0) for _ in range(groups)]
    if groups >= 4:
        for i in rng.sample(range(groups), max(1, groups // zero_every)):
            weights[i] = 0.0
    scale = total / sum(weights)
    lens = [int(w * scale) for w in weights]
    lens[max(range(groups), key=lambda i: weights[i])] += total - sum(lens)
    return lens


@dataclasses.dataclass(frozen=True)
class RaggedGroupedGemmCase:
    """``g`` local experts, ``m`` routed rows in all (non-uniform per expert), weights
    ``[g, n, k]``; the group sizes come from :func:`moe_group_lens` with ``seed``."""

    case: str
    layer: str
    g: int
    m: int
    n: int
    k: int
    seed: int

    @property
    def label(self) -> str:
        return f"{self.case}-{self.layer}"

    def group_lens(self) -> list[int]:
        return moe_group_lens(self.m, self.g, self.seed)


# (model, local experts, routed rows on the rank): DeepSeek-V3 at EP8 (32 of 256 experts, about
# 2048 rows each); Qwen3-30B-A3B with all 128 experts local (8192 tokens x top-8); gpt-oss-20b
# with its 32 experts (8192 tokens x top-4); Mixtral-8x7B (8192 tokens x top-2).
RAGGED_GROUPED_GEMM_SPECS: tuple[tuple[str, int, int], ...] = (
    ("DeepSeek-V3", 32, 65536),
    ("Qwen3-30B-A3B", 128, 65536),
    ("gpt-oss-20b", 32, 32768),
    ("Mixtral-8x7B", 8, 16384),
)


def ragged_grouped_gemm_cases(
    models: list[str] | None = None, profile: str = "gpu"
) -> list[RaggedGroupedGemmCase]:
    """The grouped-GEMM benchmark cases (gate_up and down per model); tiny ones for ``cpu``."""
    if profile == "cpu":
        return [
            RaggedGroupedGemmCase("tiny", "gate_up", 4, 96, 32, 48, 0),
            RaggedGroupedGemmCase("tiny", "down", 4, 96, 48, 16, 1),
        ]
    names = [s[0] for s in RAGGED_GROUPED_GEMM_SPECS]
    unknown = [n for n in models or () if n not in names]
    if unknown:
        raise ValueError(f"--models expected names in {names}, got {unknown}")
    cases = []
    for seed, (name, g, m) in enumerate(RAGGED_GROUPED_GEMM_SPECS):
        if models and name not in models:
            continue
        for layer, n, k in MOE_MODELS[name].expert_layers():
            cases.append(RaggedGroupedGemmCase(name, layer, g, m, n, k, seed))
    return cases
