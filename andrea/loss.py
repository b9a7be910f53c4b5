"""The training loss over a large vocabulary: the cross-entropy of the head's logits, a block of
rows at a time, so that the batch's logits are never made whole (`ANDREA.forward` with targets,
its `loss_chunk`; `andrea.memory` sizes training's memory check with `loss_chunk_rows`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_CHUNK = 4096  # rows of logits per block of chunked_cross_entropy on CUDA: 4,096 × 8,512 fp32 logits are 133 MiB
CPU_LOSS_CHUNK = 1024  # and on a CPU, where a smaller block stays nearer the cores: 1,024 × 6,401 fp32 logits are 25 MiB


class ChunkedCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy of h @ weightᵀ against targets, a block of rows at a time.

    For each block of rows: its logits in the compute dtype, their log-sum-exp and loss in fp32,
    and at once the gradient of the mean loss with respect to those logits, (softmax − onehot)/N,
    multiplied into the gradients of the block's h and of the weight (summed over blocks in
    fp32). Backward only scales those by the incoming gradient. One block's logits exist at a
    time, in one buffer every block reuses and every step works in place (max, subtract, exp,
    normalise; below float32, in a second, float32 buffer, and the gradient back into the first),
    so the batch's logits (and their fp32 copy, and its log-softmax) are never made and no block
    allocates: on a CPU a fresh 25 MiB array costs its page faults each time. The
    FLOPs are the plain path's, the backward's two matmuls moved into the forward.
    """

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int, multiple: int, dtype, want_grad: bool):
        N = h.shape[0]
        V = weight.shape[0]
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            if multiple > 1 and V % multiple:  # zero rows: a head matmul tensor cores like, logits cut back to V
                w = F.pad(w, (0, 0, 0, multiple - V % multiple))
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty_like(h) if want_grad else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=h.device) if want_grad else None
            in_place = dtype == torch.float32  # the logits' buffer is the fp32 one; else a second, fp32 buffer
            buffer = torch.empty((min(chunk, N), w.shape[0]), dtype=dtype, device=h.device)
            wide = None if in_place else torch.empty((min(chunk, N), V), dtype=torch.float32, device=h.device)
            for i in range(0, N, chunk):
                x = h[i : i + chunk].to(dtype)
                t = targets[i : i + chunk, None]
                raw = torch.mm(x, w.t(), out=buffer[: x.shape[0]])  # padded columns are 0: zero rows of w
                z = raw[:, :V] if in_place else wide[: x.shape[0]].copy_(raw[:, :V])
                z.sub_(z.amax(1, keepdim=True))  # shifted: the log-sum-exp is then log(sum(exp(z)))
                total -= z.gather(1, t).sum()
                z.exp_()
                sums = z.sum(1, keepdim=True)
                total += sums.log().sum()
                if want_grad:
                    z.div_(sums)  # the softmax
                    z.scatter_add_(1, t, torch.full(t.shape, -1.0, dtype=z.dtype, device=z.device))
                    z.div_(N)
                    if not in_place:
                        raw[:, :V].copy_(z)  # the logits' own buffer takes their gradient
                    g = raw  # the padded columns stay 0
                    if grad_h.dtype == dtype:
                        torch.mm(g, w, out=grad_h[i : i + chunk])
                    else:
                        grad_h[i : i + chunk] = g @ w
                    if in_place:
                        grad_w.addmm_(g.t(), x)
                    else:  # a product below float32, summed into the float32 gradient
                        grad_w += g.t() @ x
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w[:V].to(weight.dtype))
        return total / N

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out, grad_w * grad_out, None, None, None, None, None


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = LOSS_CHUNK,
                          multiple: int = 1) -> torch.Tensor:
    """F.cross_entropy(h @ weightᵀ, targets) for h (..., d), weight (V, d), computed `chunk` rows
    at a time (ChunkedCrossEntropy); under autocast the matmuls take autocast's dtype, as the
    plain head's would, and `multiple` pads the vocabulary as ANDREA.vocab_multiple does."""
    dev = h.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    return ChunkedCrossEntropy.apply(h.reshape(-1, h.shape[-1]), weight, targets.reshape(-1), chunk, multiple,
                                     dtype, want_grad)


def loss_chunk_rows(device) -> int:
    """Rows of logits per block of the training loss on `device` (`chunked_cross_entropy`)."""
    return LOSS_CHUNK if torch.device(device).type == "cuda" else CPU_LOSS_CHUNK
