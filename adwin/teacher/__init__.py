"""The teacher: per-token scores of the student's tokens, from one room whatever ``model.teacher_backend`` is.

- ``local``: transformers checkpoints (``load_model``, ``load_tokenizer``) and ``Teachers``, scored in process,
  with the tokenizer checks and the routing of each sample to its teacher;
- ``vllm``: ``VLLMTeacher``, prompt logprobs on a vLLM engine (``model.teacher_backend: vllm``);
- ``served``: ``ServedTeachers``, teachers behind OpenAI-compatible servers (``model.teacher_backend: server``),
  talked to by ``client`` (``TeacherClient``) in the request and answer forms of ``protocol``.

The server side (``adwin teacher serve``) is ``adwin.teacher_server``.
"""
