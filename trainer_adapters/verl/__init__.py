"""adwin inside verl: the window per request (agent loop), the exact audit in verl's actor, the driver's bookkeeping.

Nothing here imports verl at package import: ``fields``, ``driver``, ``rows``, ``rows_v1``, ``rollout``, ``settings``,
``support`` and ``gpu_check`` run without it (the driver is verl-free bookkeeping over rows; ``support`` checks verl's
config; ``gpu_check`` imports verl only in the processes it starts), while ``agent_loop``, ``loss``, ``actor``,
``trainer`` and ``task_runner`` (verl's legacy DataProto trainer), ``trainer_v1`` (verl's v1 trainer, which imports
TransferQueue), ``gpu_check_runner``, ``gpu_check_runner_v1`` and ``main`` (the launcher: ``python -m
adwin.trainer_adapters.verl.main``) import verl and are only imported by a verl process. docs/adapters.md ("verl") has the recipe; docs/decisions.md
("verl: where adwin plugs in") says why the audit is a worker method.
"""
