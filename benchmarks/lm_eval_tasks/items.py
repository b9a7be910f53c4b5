"""The items of the repository's own lm-evaluation-harness tasks (andrea_lesson_mc, andrea_lesson_gen),
read from the JSON Lines beside this file; the harness calls these through each task's `custom_dataset`."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rows(name: str) -> list[dict]:
    with open(HERE / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _dataset(name: str) -> dict:
    import datasets

    return {"test": datasets.Dataset.from_list(rows(name))}


def multiple_choice(**_metadata) -> dict:
    return _dataset("lesson_mc.jsonl")


def generation(**_metadata) -> dict:
    return _dataset("lesson_gen.jsonl")
