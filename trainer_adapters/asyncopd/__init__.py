"""AsyncOPD-style streaming scheduler with ADWIN window hooks (AsyncOPD section 7, Appendix G).

``scheduler`` is the model-agnostic core (permits, sync gate, keep-mode, FIFO stages); ``hf`` holds the
transformers stages (rollout snapshots with cached MC actions, teacher scoring, the MC reverse-KL
learner); ``run.run_asyncopd`` wires them to a ``TrainConfig`` and a controller.
"""

from adwin.trainer_adapters.asyncopd.items import PromptSpec, StreamItem, TokenOut
from adwin.trainer_adapters.asyncopd.permits import PermitPool
from adwin.trainer_adapters.asyncopd.scheduler import AsyncOPDScheduler, SchedulerConfig

__all__ = ["AsyncOPDScheduler", "PermitPool", "PromptSpec", "SchedulerConfig", "StreamItem", "TokenOut"]
