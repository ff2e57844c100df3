"""The student's decode engine (docs/design.md, "Compiled decoding"; docs/decisions.md, "One decode engine").

- ``sampler``: the one token sampler (temperature, top-p, per-row seeds, the AsyncOPD behavior draw);
- ``loop``: the one generation loop (``decode``), eager on the model's KV cache or compiled on a ``StaticBatch``;
- ``static_cache``: buckets, compile settings and ``StaticBatch``; ``kv_cache``: the cache keyword across releases;
- ``generate``: the student's generator on top of the loop (transformers' ``generate`` only where only it can);
- ``engine``: ``RolloutEngine`` with its transformers and vLLM implementations (the synchronous trainer's);
- ``streaming``, ``slots``: continuous batching for the AsyncOPD engine, eager and compiled.
"""
