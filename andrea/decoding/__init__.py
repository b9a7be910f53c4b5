"""Decoding: text from a trained model, one token at a time, through the model's own forward with
a KV cache (`andrea.model`).

    generate.py   sampling, streaming, chat and `andrea.load`: one generation at a time
    plan.py       how each step of a generation runs on its device: weight layouts, the direct
                  CPU step, fixed shapes and CUDA graphs
    batching.py   many generations decoded together in one cache (what `andrea serve` runs)
"""
