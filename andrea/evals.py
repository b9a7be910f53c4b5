"""Tasks scored as lm-evaluation-harness scores them, by andrea alone: the figures the harness must
reproduce on the exported folder (`--model hf`) and against `andrea serve` (`--model
local-completions`); docs/tools.md says how to run both.

A request is a context and a continuation. As the harness does: whitespace that ends the context
moves to the start of the continuation; the whole text and the context alone are encoded with BOS
first, as andrea trains (the harness's `add_bos_token=True`); the continuation's ids are the
whole's after the context's. Its log-likelihood is the sum of log-softmax at those positions, and it
is greedy when each of its tokens is the model's argmax there. Multiple choice picks the choice of
largest log-likelihood (the harness's `acc`). Generation decodes greedily after BOS and the context
for at most `max_tokens` tokens (or until BOS), cuts the text at the first stop string, and matches
it to the target with surrounding whitespace stripped (the harness's `exact_match` after its
`remove_whitespace` filter). A request longer than the model's context is refused in a sentence
(the harness would cut it from the left): the repository's tasks fit any context of 32 tokens.

The repository's own tasks, `andrea_lesson_mc` and `andrea_lesson_gen`, live in
benchmarks/lm_eval_tasks (their items in JSON Lines beside the task files).
"""

from __future__ import annotations

import torch

from andrea.decoding.generate import generate_ids
from andrea.errors import AndreaError, longer_than_context


def split(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids with BOS first, continuation ids), split as the harness splits them."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, bos=True)
    ctx = tokenizer.encode(context, bos=True)
    return ctx, whole[len(ctx):]


@torch.no_grad()
def loglikelihood(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """(sum of log p of the continuation's tokens after the context, whether each is the argmax)."""
    ctx, cont = split(tokenizer, context, continuation)
    ids = ctx + cont
    T = model.config.block_size
    if len(ids) - 1 > T:
        raise AndreaError(longer_than_context(len(ids) - 1, T, "context and continuation"))
    if not cont:
        return 0.0, True
    x = torch.tensor([ids[:-1]], device=model.wte.weight.device)
    logp = torch.log_softmax(model(x)[0][0].double(), dim=-1)[len(ctx) - 1 :]
    target = torch.tensor(cont, device=logp.device)
    return float(logp[torch.arange(len(cont)), target].sum()), bool((logp.argmax(-1) == target).all())


def multiple_choice(model, tokenizer, items: list[dict]) -> dict:
    """{"acc", "n", "loglikelihoods"} over items {"context", "choices", "answer"}."""
    scores = [[loglikelihood(model, tokenizer, it["context"], c)[0] for c in it["choices"]] for it in items]
    right = [max(range(len(s)), key=s.__getitem__) == it["answer"] for s, it in zip(scores, items)]
    return {"acc": sum(right) / len(items) if items else float("nan"), "n": len(items), "loglikelihoods": scores}


def generate_until(model, tokenizer, context: str, until: list[str], max_tokens: int) -> str:
    """The greedy continuation of BOS + context, cut at the first of the stop strings."""
    ids = generate_ids(model, tokenizer.encode(context, bos=True), max_tokens, greedy=True)
    text = tokenizer.decode(ids)
    for stop in until:
        text = text.split(stop)[0] if stop else text
    return text


def exact_match(model, tokenizer, items: list[dict], until: list[str], max_tokens: int) -> dict:
    """{"exact_match", "n", "replies"} over items {"context", "target"}."""
    replies = [generate_until(model, tokenizer, it["context"], until, max_tokens) for it in items]
    right = [r.strip() == it["target"].strip() for r, it in zip(replies, items)]
    return {"exact_match": sum(right) / len(items) if items else float("nan"), "n": len(items), "replies": replies}
