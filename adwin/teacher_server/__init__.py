"""``adwin teacher serve``: a teacher behind the OpenAI-compatible completions protocol, from a transformers
checkpoint, for runs with ``model.teacher_backend: server`` (docs/teacher-server.md).

``scoring`` (the model and the dynamic batcher), ``service`` (the served model's limits and checks), ``schemas``
(request and error bodies), ``strict_json`` (request bodies read as strict JSON), ``routers`` (one module per
resource: ``health``, ``models``, ``completions``), ``app`` (the FastAPI app: auth, body limit, errors), ``serve``
(the command).
"""
