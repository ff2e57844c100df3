"""The student's decode engine: one token sampler, one KV-cache / static-cache path (docs/design.md, "Compiled decoding")."""
