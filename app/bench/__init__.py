"""The parts of ``draftlight bench`` (the command itself, its arguments and the order of its
work, is :mod:`app.cmd_bench`):

* :mod:`.prompts`: the prompts, read from files and tokenized to fit the context;
* :mod:`.reference`: llama-cpp-python's own generation, the reference row;
* :mod:`.runs`: one timed run and what it did, and the ceiling of a draft length;
* :mod:`.compare`: every row on every prompt, interleaved round by round;
* :mod:`.lookup_learn`: what a learned dynamic lookup cache brings to ngram-cache;
* :mod:`.report`: the report, assembled and printed.

They use the engine (:mod:`speculators`) and the measuring helpers of :mod:`app.measure`;
none of them touches the user's files or the UI.
"""
