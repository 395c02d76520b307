"""One batch's data, whoever computes it: the rows (``rows``), what a call asks for
(``options``, ``policy``: padding and failed rows), where the results land
(``output``, ``padding``, ``sink``), the row function's state (``state``) and
identity (``identity``), and what makes a result trusted (``trust``: serial is the
reference). It imports nothing of prep's executors, pools or streams, which all
build on it.

    Rows ──fn(row i)──▶ Sink.store(i) ──▶ Output (allocated from the first row,
                                          padded where rows differ: pad=)
"""
