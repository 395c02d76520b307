"""Streams of batches (``Pool.imap``): the stream itself, a thread that keeps
``prefetch`` batches in the making (``stream``), how each batch is submitted
(``whole``: a worker builds it; ``parts``: every worker builds a part), the plan
that measures both and keeps the faster (``strategy``), and what a pool's streams
share (``streams``); what a stream measured and what bounds its loop (``stats``).
Batches run on the pool's own workers
(``prep.executors.ProcessBatches``/``ThreadBatches``), the ones ``map_rows`` uses.

    Pool.imap ─▶ Streams.open ─▶ Stream ─ submit(batch) ─▶ split: map_rows now
                                                        └▶ whole/parts: tickets on
                                                           the pool's workers
"""
