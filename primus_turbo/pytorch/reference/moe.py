"""MoE references: router, permute/unpermute and a loop-of-experts MoE layer (fp32 math)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def router_ref(
    logits: torch.Tensor,
    topk: int,
    groups: int = 1,
    selected_groups: int = 1,
    score_function: str = "sigmoid",
    scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing, written plainly. Returns ``(aux_scores [T,E], probs [T,K], idx [T,K])``.

    Scores: softmax or sigmoid of the fp32 logits. With ``groups > 1`` only the best
    ``selected_groups`` expert groups are eligible (group score = sum of its top
    ``topk // selected_groups`` scores). Ties pick the lowest index. The selected scores are
    normalised by their sum (+1e-20) when ``topk > 1`` and multiplied by ``scaling_factor``.
    ``aux_scores`` is the softmax, or the sigmoid normalised over all experts.
    """
    s = logits if logits.dtype == torch.float64 else logits.float()
    t, e = s.shape
    scores = torch.softmax(s, -1) if score_function == "softmax" else torch.sigmoid(s)
    masked = scores
    if groups > 1:
        per_group = scores.reshape(t, groups, e // groups)
        k_in_group = topk // selected_groups
        gs = torch.sort(per_group, dim=-1, descending=True, stable=True).values[..., :k_in_group]
        gscore = gs.sum(-1)
        gidx = torch.sort(gscore, dim=-1, descending=True, stable=True).indices[:, :selected_groups]
        gmask = torch.zeros(t, groups, dtype=torch.bool, device=s.device)
        gmask.scatter_(1, gidx, True)
        emask = gmask.unsqueeze(-1).expand(t, groups, e // groups).reshape(t, e)
        masked = scores.masked_fill(~emask, -1.0)  # scores are >= 0: never picked
    idx = torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :topk]
    probs = scores.gather(1, idx)
    if topk > 1:
        probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
    probs = probs * scaling_factor
    aux = scores if score_function == "softmax" else scores / scores.sum(-1, keepdim=True)
    return aux, probs, idx


def permute_ref(x: torch.Tensor, idx: torch.Tensor, num_experts: int, pad_multiple: int = 0):
    """Expert-major stable permutation. Returns ``(permuted, token_of_row [N] (-1 pad),
    copy_of_row [N], tokens_per_expert)``; padded segments end with zero rows."""
    t, k = idx.shape
    rows, toks, copies, counts = [], [], [], []
    for ex in range(num_experts):
        tok, cp = (idx == ex).nonzero(as_tuple=True)
        n = tok.numel()
        padded = -(-n // pad_multiple) * pad_multiple if pad_multiple > 0 else n
        rows.append(torch.cat([x[tok], x.new_zeros(padded - n, x.shape[1])]))
        toks.append(torch.cat([tok, tok.new_full((padded - n,), -1)]))
        copies.append(torch.cat([cp, cp.new_full((padded - n,), -1)]))
        counts.append(padded)
    tpe = torch.tensor(counts, dtype=torch.int64, device=x.device)
    return torch.cat(rows), torch.cat(toks), torch.cat(copies), tpe


def unpermute_ref(
    y: torch.Tensor,
    token_of_row: torch.Tensor,
    num_tokens: int,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[t] = sum over rows of token t of weight * y[row]``, fp32 sum, y's dtype."""
    v = y.float()
    if weights is not None:
        v = v * weights.float().unsqueeze(1)
    valid = token_of_row >= 0
    out = torch.zeros(num_tokens, y.shape[1], dtype=torch.float32, device=y.device)
    out.index_add_(0, token_of_row[valid], v[valid])
    return out.to(y.dtype)


def moe_layer_ref(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk: int,
    score_function: str = "softmax",
    groups: int = 1,
    selected_groups: int = 1,
    scaling_factor: float = 1.0,
    activation: str = "swiglu",
) -> torch.Tensor:
    """Plain PyTorch MoE layer, a loop over experts.

    ``x [T, D]``, ``router_weight [E, D]``, ``w1 [E, 2F, D]`` (gate rows, then up rows),
    ``w2 [E, D, F]`` (the ``[out, in]`` layout of ``GroupedLinear``).
    Matmuls run in the input dtype (this is also the benchmark's peer); routing in fp32.
    """
    logits = F.linear(x.float(), router_weight.float())  # router in fp32
    _, probs, idx = router_ref(
        logits, topk, groups, selected_groups, score_function, scaling_factor
    )
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    f = w2.shape[2]
    for ex in range(w1.shape[0]):
        tok, cp = (idx == ex).nonzero(as_tuple=True)
        h = x[tok] @ w1[ex].t()
        act = F.silu if activation == "swiglu" else F.gelu
        a = (act(h[:, :f].float()) * h[:, f:].float() * probs[tok, cp].unsqueeze(1)).to(x.dtype)
        out.index_add_(0, tok, (a @ w2[ex].t()).float())
    return out.to(x.dtype)
