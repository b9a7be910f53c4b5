"""Inside the blocks, for the lab's Attention, Residual and Lens views and `andrea embed lens`:
what each head attends to on a prompt, the residual stream after the embedding and after each
block, and the logit lens (that stream read through the final norm and the head). Each reads the
model's one traced pass (`andrea.model.ANDREA.trace`), computing only what it asks for.
"""

from __future__ import annotations

import torch

from andrea.errors import AndreaError, longer_than_context


def encode_prompt(model, tokenizer, text: str, bos: bool = True) -> list[int]:
    """The ids of a prompt (BOS first unless bos is False), checked against the context."""
    if not isinstance(text, str) or text == "":
        raise AndreaError("the prompt is empty; give some text.")
    ids = tokenizer.encode(text, bos=bos)
    T = model.config.block_size
    if len(ids) > T:
        raise AndreaError(longer_than_context(len(ids), T))
    return ids


def _ids_tensor(model, ids: list[int]) -> torch.Tensor:
    t = torch.tensor([ids], dtype=torch.long, device=model.wte.weight.device)
    model.check_ids(t)
    return t


@torch.no_grad()
def attention(model, tokenizer, text: str, bos: bool = True) -> dict:
    """Every layer's and head's attention pattern on a prompt: patterns[l, h, i, j] is how much
    position i attends to position j (each row sums to 1 over j <= i)."""
    ids = encode_prompt(model, tokenizer, text, bos)
    patterns = [w[0] for w in model.trace(_ids_tensor(model, ids), keep=("weights",))["weights"]]
    cfg = model.config
    return {"ids": ids, "pieces": [tokenizer.id_to_piece(i) for i in ids], "layers": cfg.n_layer, "heads": cfg.n_head,
            "patterns": torch.stack(patterns).double().cpu().numpy()}


@torch.no_grad()
def residual_stream(model, ids: list[int]) -> list[torch.Tensor]:
    """The (1, T, d) residual stream after the embedding and after each block (L + 1 states)."""
    return model.trace(_ids_tensor(model, ids)).stream()


@torch.no_grad()
def lens_logits(model, ids: list[int]) -> torch.Tensor:
    """The logit lens: (L + 1, T, V) logits read out of the residual stream after the embedding
    and after each block, through the final norm and the head (the last row is the model's own)."""
    return model.head(model.ln_f(torch.cat(residual_stream(model, ids))))


@torch.no_grad()
def logit_lens(model, tokenizer, text: str, k: int = 5, bos: bool = True) -> dict:
    """The top-k predictions after the embedding and after each block, position by position, and
    the probability each stage gives the prompt's own next token. (One stage's (T, V) logits at a
    time, so a long prompt on a large vocabulary stays small.)"""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise AndreaError(f"the number of predictions k must be an integer of at least 1, got {k!r}.")
    ids = encode_prompt(model, tokenizer, text, bos)
    piece = tokenizer.id_to_piece
    nexts = torch.tensor(ids[1:], dtype=torch.long)
    rows = []
    for state in residual_stream(model, ids):
        probs = torch.softmax(model.head(model.ln_f(state))[0].double(), dim=-1)
        top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
        own = probs[torch.arange(len(nexts)), nexts.to(probs.device)].tolist() + [None]
        rows.append([{"top": [{"id": int(i), "piece": piece(int(i)), "prob": float(p)} for p, i in zip(top.values[t], top.indices[t])],
                      "next_prob": own[t]} for t in range(len(ids))])
    stages = ["embedding"] + [f"block {i + 1}" for i in range(model.config.n_layer)]
    return {"ids": ids, "pieces": [piece(i) for i in ids], "stages": stages, "lens": rows}
