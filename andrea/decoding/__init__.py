"""Decoding: text from a trained model, one token at a time, through the model's own forward with
a KV cache (`andrea.model`).

    generate.py   sampling, streaming, chat and `andrea.load`: one generation at a time
    plan.py       how each step of a generation runs on its device: weight layouts, the direct
                  CPU step, fixed shapes and CUDA graphs
    batching.py   many generations decoded together in one cache (what `andrea serve` runs)
"""

# `andrea chat`'s sampling unless told otherwise (Chat's defaults), and the chat the main job shows:
# the main job's three seeds at width 256 replied readably to 83, 42 and 45% of bench_chat.py's openings at
# temperature 1.0 over every token, and to 98, 73 and 73% at these settings (BENCHMARKS "Chatting
# with the main job's model"). `andrea serve` keeps OpenAI's default, temperature 1 over every token.
CHAT_TEMPERATURE, CHAT_TOP_K = 0.8, 40
