"""The lessons, claim by claim, on the learner's own model (`andrea lesson`, the lab's Lesson tab).

    embedding   the lookup tables: rows picked by id, their start, their updates, closeness, positions
                (andrea.inside.lessons.embedding; the default walk)
    attention   block 1's scores from dot products, the √d_head scale, the causal mask, the output
                rebuilt, what each head attends to and costs, later tokens predicted better
                (andrea.inside.lessons.attention)
    block       a block rebuilt, layer norm, the MLP, the residual stream, the logit lens, each part
                removed, the head as its own table, the blocks' share of the parameters
                (andrea.inside.lessons.block)

Each walk gives `Step`s with a verdict (andrea.inside.lessons.report).
"""
