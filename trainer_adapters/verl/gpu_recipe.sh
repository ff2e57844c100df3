#!/usr/bin/env bash
# adwin inside verl, end to end on GPUs: NOT YET RUN (written without a GPU; the CPU tests cover the agent loop,
# the driver, verl's post-processing and the actor's audit, not verl's Ray workers, FSDP engine or vLLM). Its
# overrides on verl 0.9.1's Hydra config pass verl's own validate_config and adwin's setting checks on CPU
# (tests/trainer_adapters/verl/test_verl_recipe.py runs this file to read them, and runs adwin's main on them
# up to where verl starts Ray).
#
# Distillation trains no critic: grpo as the estimator (verl's default, gae, would build one) and the critic off.
# TRAINER=v1 (the default, as verl's): verl's v1 trainer in its synchronous mode (TransferQueue, PPOTrainerSync);
# TRAINER=legacy: verl's DataProto trainer (trainer.use_v1=false), which verl 0.9.1 calls deprecated.
#
# One node, 8 GPUs: the student (actor + vLLM rollout, FSDP2) on 4, the teacher (vLLM, prompt logprobs) on 4.
# Needs: verl==0.9.1 with vLLM, transformers<5.11, adwin installed in the same environment, and a gsm8k parquet
# made by verl's examples/data_preprocess/gsm8k.py (DATA below). Prints the window each step (window/size).
set -euo pipefail

DATA=${DATA:-$HOME/data/gsm8k}
STUDENT=${STUDENT:-Qwen/Qwen3-0.6B}
TEACHER=${TEACHER:-Qwen/Qwen3-4B}
HORIZON=${HORIZON:-2048}
STEPS=${STEPS:-20}
CONTROLLER=${CONTROLLER:-}  # e.g. http://127.0.0.1:8470 (adwin controller serve); empty: embedded in the driver
TRAINER=${TRAINER:-v1}
case "$TRAINER" in
  v1) TRAINER_ARGS=(trainer.use_v1=true trainer.v1.trainer_mode=sync) ;;
  legacy) TRAINER_ARGS=(trainer.use_v1=false) ;;
  *) echo "TRAINER must be v1 or legacy, got $TRAINER" >&2; exit 2 ;;
esac

# adwin's main: verl's own main_ppo command line and checks, then verl's run_ppo with adwin's TaskRunner
python3 -m adwin.trainer_adapters.verl.main \
    "${TRAINER_ARGS[@]}" algorithm.adv_estimator=grpo critic.enable=false \
    data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
    data.train_batch_size=64 data.max_prompt_length=512 data.max_response_length="$HORIZON" \
    actor_rollout_ref.model.path="$STUDENT" \
    actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_dynamic_bsz=false actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 \
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.response_length="$HORIZON" actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.agent.default_agent_loop=adwin \
    distillation.enabled=true distillation.n_gpus_per_node=4 distillation.nnodes=1 \
    distillation.teacher_models.teacher_model.model_path="$TEACHER" \
    distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=1 \
    distillation.distillation_loss.loss_mode=k1 distillation.distillation_loss.use_policy_gradient=true \
    distillation.distillation_loss.use_task_rewards=false \
    +adwin.candidates="[256,512,1024]" +adwin.threshold=0.7 +adwin.probe_batch_size=8 +adwin.offers_per_step=8 \
    ${CONTROLLER:+"+adwin.controller=$CONTROLLER"} \
    trainer.n_gpus_per_node=4 trainer.nnodes=1 trainer.total_training_steps="$STEPS" \
    trainer.logger='["console"]' trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1
