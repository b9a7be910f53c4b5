"""Looking inside a model: the modules that read what a model holds and does, together.

    embed.py            the two tables (wte and the head): rows, norms, cosines, neighbours, maps,
                        positions, where the parameters live
    blocks.py           inside the blocks: attention patterns, the residual stream, the logit lens
    heads.py            what each attention head attends to, scored at every snapshot of a run
    vectors.py          a model's tables as arrays, and the arithmetic every view shares
    wordsim.py          SimLex-999, WordSim-353, analogies, and the PPMI reference
    context_vectors.py  word vectors from the blocks; one token split by the words it begins
    lessons/            the lessons' claims checked on a model: embedding, attention, block

Every one of them that looks inside the blocks reads the model's one traced pass
(`andrea.model.ANDREA.trace`); none walks the blocks by hand.
"""
