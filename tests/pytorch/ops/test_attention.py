"""Flash attention (dense bshd): forward, lse and dq/dk/dv vs the fp32 reference, per backend.

CPU: TRITON under the interpreter at tiny shapes, TORCH (SDPA / reference) everywhere.
GPU: odd sequence lengths (1, 17, 1000, 4097), Sq != Sk, head dims 64/96/128/256/192x128,
GQA/MQA ratios, causal and windows.
"""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.reference import attention_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import assert_close, rand, snr_db

pytestmark = pytest.mark.attention

NO_WIN = (-1, -1)
# (b, sq, sk, hq, hkv, dqk, dv, causal, window): tiny, for the interpreter
CPU_CASES = [
    (1, 1, 1, 2, 1, 16, 16, False, NO_WIN),
    (1, 17, 17, 4, 2, 32, 32, True, NO_WIN),
    (2, 33, 17, 2, 1, 16, 16, True, NO_WIN),  # Sq > Sk causal: first rows see no key
    (1, 17, 33, 3, 1, 64, 64, False, (4, 2)),  # MQA, two-sided window
    (1, 33, 33, 2, 2, 48, 32, True, (8, -1)),  # Dqk != Dv (padded), causal + left window
]
GPU_CASES = [
    (2, 1, 1, 8, 8, 128, 128, True, NO_WIN),
    (2, 17, 17, 8, 2, 64, 64, True, NO_WIN),
    (1, 1000, 1000, 8, 1, 128, 128, False, NO_WIN),
    (1, 1000, 1000, 8, 8, 256, 256, True, NO_WIN),
    (1, 4097, 4097, 4, 4, 128, 128, True, NO_WIN),
    (1, 1000, 1000, 16, 16, 192, 128, True, NO_WIN),  # DeepSeek qk 192 / v 128
    (1, 1000, 4097, 8, 2, 128, 128, True, NO_WIN),  # Sq < Sk (bottom-right)
    (2, 1000, 17, 8, 4, 64, 64, True, NO_WIN),  # Sq > Sk: empty rows
    (1, 4097, 4097, 8, 2, 128, 128, True, (256, -1)),  # sliding window
    (1, 1000, 1000, 4, 1, 64, 64, False, (100, 50)),
    (1, 17, 1000, 32, 8, 128, 128, False, NO_WIN),
    (2, 4097, 4097, 8, 2, 192, 128, False, NO_WIN),  # qk 192 = 128 + 64 chunks, GQA
    (1, 1000, 1000, 4, 4, 96, 96, True, (100, -1)),  # qk 96 = 64 + 32 chunks, window
]
CASES = GPU_CASES if HAS_GPU else CPU_CASES


def _case_id(c):
    b, sq, sk, hq, hkv, dqk, dv, causal, win = c
    mask = "causal" if causal else "full"
    return f"b{b}_s{sq}x{sk}_h{hq}x{hkv}_d{dqk}x{dv}_{mask}_w{win[0]}_{win[1]}"


def _inputs(b, sq, sk, hq, hkv, dqk, dv, dtype, device):
    q = rand(b, sq, hq, dqk, dtype=dtype, device=device, requires_grad=True)
    k = rand(b, sk, hkv, dqk, dtype=dtype, device=device, requires_grad=True)
    v = rand(b, sk, hkv, dv, dtype=dtype, device=device, requires_grad=True)
    return q, k, v


def check_attention(case, dtype, device, layout="bshd"):
    b, sq, sk, hq, hkv, dqk, dv, causal, window = case
    q, k, v = _inputs(b, sq, sk, hq, hkv, dqk, dv, dtype, device)
    args = (q, k, v)
    if layout == "bhsd":  # a transposed view of contiguous [b, h, s, d]
        args = tuple(t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
                     for t in (q, k, v))  # fmt: skip
    out, lse = turbo.ops.flash_attn_func(*args, causal=causal, window_size=window,
                                         return_lse=True)  # fmt: skip
    assert out.shape == (b, sq, hq, dv) and out.dtype == dtype
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_ref(qr, kr, vr, None, causal, window)
    assert_close(out, ref, dtype)
    assert torch.equal(torch.isinf(lse).cpu(), torch.isinf(ref_lse).cpu()), "lse -inf rows differ"
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin].cpu(), ref_lse[fin].cpu(), rtol=1e-3, atol=1e-3)
    grad = rand(b, sq, hq, dv, dtype=dtype, device=device)
    out.backward(grad)
    ref.backward(grad.float())
    for got, want in zip((a.grad for a in args), (qr.grad, kr.grad, vr.grad), strict=True):
        assert got.shape == want.shape and got.dtype == dtype
        assert_close(got, want, dtype)
        if want.abs().max() > 0:
            assert snr_db(want, got.float()) > 35


# On the CPU the default is TRITON under the interpreter (same as the pinned TRITON cases).
BACKENDS = (
    [None, BackendType.TRITON, BackendType.TORCH]
    if HAS_GPU
    else [BackendType.TRITON, BackendType.TORCH]
)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name if b else "default")
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_flash_attn(case, backend, device):
    if backend == BackendType.TORCH and not HAS_GPU and case[1] > 20:
        pytest.skip("TORCH on CPU: covered by the smaller cases")
    GlobalBackendManager.set_attn_backend(backend)
    check_attention(case, torch.bfloat16, device)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd"])
def test_flash_attn_strided_layout(layout, device):
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    check_attention((2, 300, 300, 8, 2, 128, 128, True, NO_WIN), torch.bfloat16, device, layout)


@pytest.mark.gpu
def test_flash_attn_fp16_and_scale(device):
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    q, k, v = _inputs(2, 257, 300, 8, 4, 128, 128, torch.float16, device)
    out = turbo.ops.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True)
    ref, _ = attention_ref(q.float(), k.float(), v.float(), 0.3, True)
    assert_close(out, ref, torch.float16)


def test_empty_rows_are_zero_without_nan(device):
    """Sq > Sk causal: the first Sq - Sk rows see no key -> output 0, lse -inf, finite grads."""
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    q, k, v = _inputs(1, 20, 4, 2, 1, 16, 16, torch.bfloat16, device)
    out, lse = turbo.ops.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :16] == 0) and torch.isinf(lse[:, :, :16]).all()
    out.float().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.all(q.grad[:, :16] == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["padded", "pinned"])
def test_qk_dim_variants(variant, device, monkeypatch):
    """The env-selectable variants of the Triton kernels stay correct: the qk dim padded to a
    power of two (PRIMUS_TURBO_ATTN_SPLIT_D=0) instead of split, and pinned tiles
    (PRIMUS_TURBO_ATTN_{FWD,DQ,DKDV}_CONFIG) instead of the tuned ones."""
    from primus_turbo.triton.attention import attn_launch

    if variant == "padded":
        monkeypatch.setattr(attn_launch, "_split_kinds", lambda: ())
    else:
        pins = {"fwd": "m64n64w4s2", "dq": "m64n32w8s2", "dkdv": "m16n64w8s2",
                "dv": "m32n128w8s2", "dk": "m16n128w8s2"}  # fmt: skip
        monkeypatch.setattr(attn_launch, "_pinned", lambda kind: pins[kind])
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    for case in ((1, 1000, 1000, 8, 8, 192, 128, True, NO_WIN),
                 (1, 333, 333, 4, 2, 96, 96, False, NO_WIN)):  # fmt: skip
        check_attention(case, torch.bfloat16, device)


@pytest.mark.parametrize("mode", ["parts", "fused"])
def test_dkdv_fused_or_in_two_launches(mode, device, monkeypatch):
    """PRIMUS_TURBO_ATTN_DKDV_PARTS: dK and dV from one kernel, or a dV launch and a dK launch
    (the default candidate for the split 192 qk dim on a GPU)."""
    from primus_turbo.triton.attention import attn_launch

    monkeypatch.setattr(attn_launch, "_dkdv_env", lambda: {"parts": "1", "fused": "0"}[mode])
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    if device == "cpu" and mode == "fused":
        pytest.skip("the CPU default: covered by test_flash_attn")
    cases = [(1, 33, 33, 4, 2, 48, 32, True, (8, -1))]
    if HAS_GPU:
        cases = [(1, 1000, 1000, 8, 2, 192, 128, True, NO_WIN),
                 (2, 1000, 1000, 8, 8, 192, 128, False, (300, 10)),
                 (1, 1000, 1000, 8, 2, 128, 128, True, NO_WIN)]  # fmt: skip
    for case in cases:
        check_attention(case, torch.bfloat16, device)


def test_sm90_split_dim_defaults(monkeypatch):
    """sm_90, split 192 qk dim: one pinned tile per kernel (the H200 autotune winners, nothing
    to time or compile twice) and the dK/dV pair in two launches unless the env asks otherwise;
    the d128 lists stay short (<= 2 timed candidates per kernel: compile time)."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.attention import attn_launch
    from primus_turbo.triton.attention.attn_configs import attn_configs

    hop = ArchFamily.HOPPER
    names = {k: [c.name for c in attn_configs(hop, k, 192)] for k in ("fwd", "dq", "dv", "dk")}
    assert names == {"fwd": ["m128n64w8s3"], "dq": ["m128n64w8s2"], "dv": ["m64n128w8s1"],
                     "dk": ["m32n128w8s1"]}  # fmt: skip
    assert all(len(attn_configs(hop, k, 128)) <= 2 for k in ("fwd", "dq", "dkdv"))
    for env, want in (("", "parts"), ("auto", "auto"), ("0", "fused")):
        monkeypatch.setattr(attn_launch, "_dkdv_env", lambda env=env: env)
        assert attn_launch._dkdv_mode(hop, 192) == want
        assert attn_launch._dkdv_mode(hop, 128) == ("fused" if env != "1" else "parts")
    monkeypatch.setattr(attn_launch, "_dkdv_env", lambda: "")
    assert attn_launch._dkdv_mode(ArchFamily.CDNA3, 192) == "auto"  # AMD: timed per shape


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
def test_flash_attn_torch_compile(backend, device):
    GlobalBackendManager.set_attn_backend(backend)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda q, k, v: turbo.ops.flash_attn_func(q, k, v, causal=True) * 2.0,
        fullgraph=True,
        backend="inductor" if HAS_GPU else "aot_eager",  # CPU: trace only (inductor costs ~50 s)
    )
    q, k, v = _inputs(1, 17, 17, 4, 2, 32, 32, torch.bfloat16, device)
    out = compiled(q, k, v)
    out.float().sum().backward()
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = attention_ref(qr, kr, vr, None, True)[0] * 2.0
    ref.sum().backward()
    assert_close(out, ref, torch.bfloat16)
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert_close(got, want, torch.bfloat16)


@pytest.mark.deterministic
def test_flash_attn_backward_deterministic(device):
    """TRITON's backward has no atomics: repeated runs are bitwise equal (GQA sums included)."""
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    shape = (1, 33, 33, 4, 1, 32, 32) if device == "cpu" else (2, 2048, 2048, 32, 8, 128, 128)
    q, k, v = _inputs(*shape, torch.bfloat16, device)
    grad = rand(*shape[:2], shape[3], shape[6], dtype=torch.bfloat16, device=device)
    first = None
    for _ in range(3 if device == "cpu" else 10):
        q.grad = k.grad = v.grad = None
        out = turbo.ops.flash_attn_func(q, k, v, causal=True)
        out.backward(grad)
        now = (out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone())
        first = first or now
        for x, y in zip(first, now, strict=True):
            assert torch.equal(x, y)


BAD = [
    ("k heads", dict(k=(1, 8, 3, 16), v=(1, 8, 3, 16)), ValueError, "head count dividing"),
    ("v heads", dict(v=(1, 8, 1, 16)), ValueError, "heads (same as k)"),
    ("head dim", dict(k=(1, 8, 2, 32)), ValueError, "head dim 16"),
    ("rank", dict(q=(8, 4, 16)), ValueError, "4-D tensor"),
    ("batch", dict(k=(2, 8, 2, 16), v=(2, 8, 2, 16)), ValueError, "batch 1"),
]


@pytest.mark.parametrize("name,shapes,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_shapes(name, shapes, exc, msg, device):
    dims = {"q": (1, 8, 4, 16), "k": (1, 8, 2, 16), "v": (1, 8, 2, 16), **shapes}
    t = {n: rand(*s, dtype=torch.bfloat16, device=device) for n, s in dims.items()}
    with pytest.raises(exc, match="primus_turbo.flash_attn") as err:
        turbo.ops.flash_attn_func(t["q"], t["k"], t["v"])
    assert msg in str(err.value)


def test_bad_dtypes_and_options(device):
    q = rand(1, 8, 4, 16, dtype=torch.bfloat16, device=device)
    k = rand(1, 8, 2, 16, dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError, match="argument 'k/v'"):
        turbo.ops.flash_attn_func(q, k.half(), k)
    with pytest.raises(TypeError, match="argument 'q' expected dtype"):
        turbo.ops.flash_attn_func(q.int(), k, k)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        turbo.ops.flash_attn_func(q, k, k, dropout_p=0.1)
    with pytest.raises(ValueError, match="window_size"):
        turbo.ops.flash_attn_func(q, k, k, window_size=(-2, 0))
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    with pytest.raises(ValueError, match="pinned backend TRITON cannot handle"):
        turbo.ops.flash_attn_func(q.float(), k.float(), k.float())


def test_aiter_backend_says_why(device):
    from primus_turbo.pytorch.kernels.attention.attention_impl import AttnDispatcher

    q = rand(1, 8, 4, 16, dtype=torch.bfloat16, device=device)
    k = rand(1, 8, 2, 16, dtype=torch.bfloat16, device=device)
    args = dict(cu_q=None, cu_k=None, max_sq=8, max_sk=8, scale=0.25, causal=False)
    verdicts = AttnDispatcher.verdicts(q=q, k=k, v=k, window=NO_WIN, return_lse=False, **args)
    assert verdicts[BackendType.TORCH].ok
    try:
        import aiter  # noqa: F401
    except Exception:
        assert not verdicts[BackendType.AITER].ok and "aiter" in verdicts[BackendType.AITER].reason


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_default_dispatch_without_lse(causal, device):
    """Without lse on CUDA the default times SDPA against TRITON (fwd+bwd) and keeps the faster;
    either way the result and gradients match the reference."""
    from primus_turbo.pytorch.kernels.attention.attention_impl import AttnDispatcher

    q, k, v = _inputs(2, 1000, 1000, 16, 4, 128, 128, torch.bfloat16, device)
    out = turbo.ops.flash_attn_func(q, k, v, causal=causal)
    kwargs = dict(q=q, k=k, v=v, cu_q=None, cu_k=None, max_sq=1000, max_sk=1000,
                  scale=128**-0.5, causal=causal, window=NO_WIN, return_lse=False)  # fmt: skip
    assert AttnDispatcher.resolve(**kwargs) in (BackendType.TORCH, BackendType.TRITON)
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, _ = attention_ref(qr, kr, vr, None, causal)
    assert_close(out, ref, torch.bfloat16)
    grad = rand(*out.shape, dtype=torch.bfloat16, device=device)
    out.backward(grad)
    ref.backward(grad.float())
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert_close(got, want, torch.bfloat16)


def _sdpa_nodes(out):
    """Names of the SDPA autograd nodes behind ``out`` (the node that will run the backward)."""
    names, todo, seen = [], [out.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if "ScaledDotProduct" in type(fn).__name__:
            names.append(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return names


def test_sdpa_order_pins_kernel_and_respects_user_switches(device):
    """TORCH runs SDPA with SDPA_ORDER as its priority (cuDNN first on CUDA); the autograd node
    of that forward kernel is what runs the backward, so forward and backward use one kernel.
    Kernels the user switched off stay off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from primus_turbo.pytorch.kernels.attention.attention_impl import sdpa_order

    assert sdpa_order()[0] == SDPBackend.CUDNN_ATTENTION
    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_order() == [SDPBackend.MATH]
    on_cuda = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if on_cuda else torch.float32
    q, k, v = _inputs(1, 64, 64, 4, 2, 64, 64, dtype, device)
    GlobalBackendManager.set_attn_backend(BackendType.TORCH)
    try:
        out = turbo.ops.flash_attn_func(q, k, v, causal=True)
        nodes = _sdpa_nodes(out)
        assert len(nodes) == 1, nodes
        if on_cuda and torch.version.hip is None:
            assert "Cudnn" in nodes[0], nodes  # cuDNN SDPA supports this case on sm_90
        with sdpa_kernel([SDPBackend.MATH]):  # math is composite: no fused SDPA node
            assert _sdpa_nodes(turbo.ops.flash_attn_func(q, k, v, causal=True)) == []
        out.backward(torch.ones_like(out))
        assert q.grad is not None and torch.isfinite(q.grad.float()).all()
    finally:
        GlobalBackendManager.set_attn_backend(None)


@pytest.fixture
def sdpa_ctx(monkeypatch):
    """Sets PRIMUS_TURBO_ATTN_SDPA_CTX for one test (the reader is cached)."""
    from primus_turbo.pytorch.kernels.attention import attention_impl

    def set_mode(mode):
        monkeypatch.setenv("PRIMUS_TURBO_ATTN_SDPA_CTX", mode)
        attention_impl.sdpa_ctx_mode.cache_clear()

    yield set_mode
    monkeypatch.undo()
    attention_impl.sdpa_ctx_mode.cache_clear()


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_sdpa_ctx_modes_same_kernel_and_state_restored(mode, sdpa_ctx, device):
    """Both ways of imposing SDPA_ORDER (PRIMUS_TURBO_ATTN_SDPA_CTX) pick the same SDPA kernel
    (cuDNN on CUDA even under an outer priority that puts flash first), give the same bits as
    each other, keep user switches off, and leave torch's switches (and in fast mode its priority
    list) as they were."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    on_cuda = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if on_cuda else torch.float32
    q, k, v = _inputs(1, 64, 64, 4, 2, 64, 64, dtype, device)
    flags = ("cudnn_sdp_enabled", "flash_sdp_enabled", "mem_efficient_sdp_enabled",
             "math_sdp_enabled")  # fmt: skip

    def state():
        # the switches always come back; the priority list exactly only in fast mode (torch's
        # sdpa_kernel restores it from the enabled kernels: under an outer sdpa_kernel([MATH])
        # "full" leaves MATH first and the others in the restored order)
        prio = list(torch._C._get_sdp_priority_order()) if m == "fast" else None
        return prio, [getattr(torch.backends.cuda, f)() for f in flags]

    GlobalBackendManager.set_attn_backend(BackendType.TORCH)
    try:
        outs = {}
        for m in ("full", mode):
            sdpa_ctx(m)
            outer = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                     SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # fmt: skip
            with sdpa_kernel(outer, set_priority=True):
                before = state()
                out = turbo.ops.flash_attn_func(q, k, v, causal=True)
                assert state() == before
            nodes = _sdpa_nodes(out)
            if on_cuda and torch.version.hip is None:
                assert len(nodes) == 1 and "Cudnn" in nodes[0], nodes
            with sdpa_kernel([SDPBackend.MATH]):
                before = state()
                assert _sdpa_nodes(turbo.ops.flash_attn_func(q, k, v, causal=True)) == []
                assert state() == before
            outs[m] = out
            out.backward(torch.ones_like(out))
        assert torch.equal(outs["full"], outs[mode])
    finally:
        GlobalBackendManager.set_attn_backend(None)


def test_sdpa_ctx_bad_value_raises(sdpa_ctx):
    from primus_turbo.pytorch.kernels.attention.attention_impl import sdpa_ctx_mode

    sdpa_ctx("fastest")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_ATTN_SDPA_CTX") as err:
        sdpa_ctx_mode()
    assert "'fastest'" in str(err.value)
    sdpa_ctx("FULL")
    assert sdpa_ctx_mode() == "full"


@pytest.mark.parametrize(
    "var,reader,value",
    [
        ("PRIMUS_TURBO_ATTN_SPLIT_D", "_split_kinds", "both"),
        ("PRIMUS_TURBO_ATTN_DKDV_PARTS", "_dkdv_env", "yes"),
        ("PRIMUS_TURBO_ATTN_FWD_CONFIG", "_pinned", "m16n64"),
    ],
)
def test_bad_env_values_raise(var, reader, value, monkeypatch):
    """An invalid value of an attention env knob raises naming the variable and the value."""
    from primus_turbo.triton.attention import attn_launch

    fn = getattr(attn_launch, reader)
    call = (lambda: fn("fwd")) if reader == "_pinned" else fn
    monkeypatch.setenv(var, value)
    fn.cache_clear()
    try:
        with pytest.raises(ValueError, match=var) as err:
            call()
        assert repr(value) in str(err.value)
        monkeypatch.setenv(var, "0" if reader != "_pinned" else "m16n64w8s1")
        fn.cache_clear()
        call()  # a valid value is accepted
    finally:
        monkeypatch.undo()
        fn.cache_clear()
