"""Varied test prompts, each well over 128 tokens, some copy-heavy."""

CODE = '''def merge_intervals(intervals):
    """Merge overlapping intervals given as (start, end) pairs."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


def total_covered(intervals):
    return sum(end - start for start, end in merge_intervals(intervals))
'''

TEXT = (
    "The lighthouse keeper climbed the hundred and twelve steps every evening at dusk. "
    "He carried a can of oil, a cloth, and a small notebook in which he wrote the weather, "
    "the ships he saw, and the colour of the sea. In winter the wind pressed against the glass "
    "so hard that the whole tower seemed to hum, and in summer the gulls nested on the gallery "
    "rail and complained whenever he opened the door. He had kept the light for thirty years, "
    "and in all that time it had never once gone dark. On the night of the great storm, when "
    "the telegraph lines came down and the harbour master sent a boy running along the cliff "
    "path, the keeper was already at the top of the tower, trimming the wick by hand."
)

BACKGROUND = (
    "Speculative decoding speeds up text generation: a cheap drafter guesses several tokens, "
    "and the large model checks all of them in one batch, keeping the longest prefix it agrees "
    "with. Because the model verifies every guess, the output is exactly what it would have "
    "written alone; only the time changes. Drafters can be small models of the same family, "
    "n-gram lookups over the text so far, or heads trained on the model's hidden states. The more of the text the drafter "
    "guesses right, the fewer times the large model has to run, and the faster the reply appears. "
)

PROMPTS: list[str] = [
    "Rewrite the following Python code exactly, keeping every line the same:\n\n" + CODE,
    "Quote the following text exactly, word for word:\n\n" + TEXT,
    "Here is some code. Repeat it, then explain what it does.\n\n" + CODE,
    BACKGROUND + "\n\nExplain speculative decoding to a ten-year-old in a few sentences.",
    BACKGROUND + "\n\nList five kinds of drafters and one sentence about each.",
    TEXT + "\n\nContinue this story for a few more paragraphs.",
    TEXT + "\n\nSummarise the passage above in one sentence, then quote its first sentence.",
    "Write a table of the first twelve square numbers, one per line, in the form 'n squared is m'. "
    + BACKGROUND,
    "Translate to French, then repeat the English original:\n\n" + TEXT,
    "Write a JSON object describing three books with title, author and year. Here is context "
    "you may ignore: " + BACKGROUND,
    "Repeat the word 'lighthouse' twenty times separated by commas, then say why repetition "
    "helps n-gram drafters. " + BACKGROUND,
]
