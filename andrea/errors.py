"""The one exception type a user can cause.

Anything the user can get wrong (a bad path, a corrupt file, an id out of range) raises
`AndreaError` with one sentence that says what was expected and what was found. The CLI prints
that sentence and exits with status 2; library callers can catch it like any exception.
`AndreaError` subclasses `ValueError`, so code that checks for `ValueError` keeps working.
"""


class AndreaError(ValueError):
    pass


def longer_than_context(n: int, limit: int, what: str = "prompt", whose: str = "the model's context") -> str:
    """The one sentence for a prompt (or a sequence) of n tokens over the model's context of
    `limit` tokens, or over a smaller limit that `whose` names ("this view's limit")."""
    return f"the {what} is {n:,} tokens, more than {whose} of {limit:,} tokens; give a shorter {what}."
