"""The student being trained, as parameters: which of them train (LoRA adapters or all, ``lora.py``), how the ranks
hold them (FSDP2 shards, ``fsdp.py``), what the model is made of (``structure.py``) and the optimizer over what
trains (``optimizer.py``). Everything that walks "the student's parameters" asks here, so a full fine-tuning
student, a LoRA student and a sharded one go through the same loops.
"""
