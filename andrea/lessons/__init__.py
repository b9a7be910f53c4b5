"""The lessons, claim by claim, on the learner's own model (`andrea lesson`, the lab's Lesson tab).

    embedding   the lookup tables: rows picked by id, their start, their updates, closeness, positions
                (andrea.lessons.embedding; the default walk)
    attention   block 1's scores from dot products, the √d_head scale, the causal mask, the output
                rebuilt, what each head attends to and costs, later tokens predicted better
                (andrea.lessons.attention)

Each walk gives `Step`s with a verdict (andrea.lessons.report).
"""
