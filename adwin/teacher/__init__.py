"""The teacher: per-token scores of the student's tokens, from one room whatever ``model.teacher_backend`` is.

- ``scoring``: the one scoring path: a teacher's forward pass on the student's columns, and realized-token, top-k
  and MC-action logprobs read a chunk of positions at a time on its device (``topk_logprobs`` for adapters);
- ``load``: ``load_teachers``, the scorer ``model.teacher_backend`` names (``AnyTeachers``);
- ``local``: ``Teachers``, transformers models scored in process (``hf``; full logits for the dense losses);
- ``vllm``: ``EngineTeachers`` over ``VLLMTeacher``, prompt logprobs on a vLLM engine (``vllm``);
- ``served``: ``ServedTeachers``, teachers behind OpenAI-compatible servers (``server``), talked to by ``client``
  (``TeacherClient``) in the request and answer forms of ``protocol``;
- ``checkpoints``: loading a checkpoint (``load_model``, ``load_tokenizer``; the student's too) and the tokenizer
  check every teacher passes against the student's; ``routing``: which teacher scores which sample.

The server side (``adwin teacher serve``) is ``adwin.teacher_server``.
"""
