"""A lesson's steps and how they are reported: the claim, how andrea checked it, a verdict, the numbers.

Every walk (andrea.inside.lessons.embedding, andrea.inside.lessons.attention) returns a list of `Step`s; each
gives the claim in one sentence, how it was checked on this model, a verdict and, in `numbers`,
every figure the sentence quotes as a number (what `--json` prints and the lab draws):

    holds                the numbers say what the claim says
    holds with a caveat  they do, with something the learner should know (`why` says what)
    does not hold here   they do not, and `why` says what this model or run does instead
    cannot check         this input lacks what the step needs (`why` names it)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

HOLDS, CAVEAT, FAILS, CANNOT = "holds", "holds with a caveat", "does not hold here", "cannot check"
VERDICTS = (HOLDS, CAVEAT, FAILS, CANNOT)


@dataclass
class Step:
    key: str
    claim: str
    how: str
    verdict: str
    why: str = ""
    numbers: dict = field(default_factory=dict)


def walk(inp, steps, what: str, log=None, logged=()) -> list[Step]:
    """Every step of a walk over the blocks, in order, on a model that has blocks; the steps in
    `logged` report their progress to `log`."""
    from andrea.errors import AndreaError

    if not len(inp.model.h):
        raise AndreaError(f"the model has no blocks: there is no {what} to walk through.")
    return [step(inp, log) if step in logged else step(inp) for step in steps]


def config_of(model) -> dict:
    cfg = model.config
    return {"V": cfg.vocab_size, "d": cfg.n_embd, "T": cfg.block_size, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "pos": cfg.pos}


def report_json(walk: str, name: str, model, steps: list[Step], left_out: list[str]) -> dict:
    """What `andrea lesson --json` prints: the walk, the model, every step with its numbers, and
    what the walk left out (each with why)."""
    return {"walk": walk, "model": name, "config": config_of(model), "steps": [asdict(s) for s in steps],
            "left_out": list(left_out)}


def report_text(title: str, steps: list[Step], left_out: list[str]) -> str:
    """The steps numbered as the learner reads them, each with how and its verdict, then a count."""
    lines = [title, ""]
    for n, s in enumerate(steps, 1):
        lines += [f"{n}. {s.claim}", f"   {s.how}", f"   {s.verdict}" + (f": {s.why}" if s.why else ""), ""]
    lines += [f"Note: {note}." for note in left_out] + ([""] if left_out else [])
    counts = {v: sum(s.verdict == v for s in steps) for v in VERDICTS}
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items() if n))
    return "\n".join(lines)
