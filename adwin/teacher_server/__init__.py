"""``adwin teacher serve``: a teacher behind the OpenAI-compatible completions protocol, from a transformers
checkpoint, for runs with ``model.teacher_backend: server`` (docs/teacher-server.md).

``scoring`` (the model and the dynamic batcher), ``schemas`` (request and error bodies), ``routers`` (one
module per resource: ``models``, ``completions``), ``app`` (the FastAPI app: auth, body limit, errors),
``serve`` (the command).
"""
