# Memory planner and max-batch search, end to end (docs/memory-planner.md).
# e2e_plan_measure_<deck>: `plan --measure` at 2 ranks (simulated as 2 hosts of 1 rank, so the
# hybrid strategies differ from full_shard) runs 2 real steps per strategy under the counting
# allocator and fails if any planned peak is more than 10% off the measured one. Small decks in
# plan/: fp32 GPT-2, fp32 Llama with GQA, fp32 ViT, bf16 GPT-2 with recomputation, bf16 Llama,
# LoRA on a bf16 Llama (frozen bf16 base), QLoRA on it (the base's linear weights as NF4 with double
# quantization), a partial fine-tune of an fp32 GPT-2 (train.freeze).
if(TARGET shardtrain)
  foreach(deck gpt2-fp32 llama-gqa-fp32 vit-fp32 gpt2-bf16-recompute llama-bf16 llama-lora-bf16 llama-qlora-bf16 gpt2-freeze-fp32)
    string(MAKE_C_IDENTIFIER "${deck}" deck_id)
    add_test(NAME e2e_plan_measure_${deck_id}
      COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 2 $<TARGET_FILE:shardtrain> plan
              ${CMAKE_CURRENT_LIST_DIR}/plan/${deck}.toml --ranks-per-host 1 --measure --steps 2 --tolerance 0.10)
    set_tests_properties(e2e_plan_measure_${deck_id} PROPERTIES PROCESSORS 2 TIMEOUT 180 LABELS "e2e;mpi;plan"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
  # The report without MPI ranks: GPT-2 XL on 16 GPUs of 40 GiB in 2 nodes; nothing but the
  # planner runs. It must print every strategy's diagram and a recommendation.
  add_test(NAME e2e_plan_report_gpt2_xl
    COMMAND $<TARGET_FILE:shardtrain> plan ${PROJECT_SOURCE_DIR}/inputs/gpt2-xl.toml --ranks 16 --ranks-per-host 8
            --device-memory 40GiB)
  set_tests_properties(e2e_plan_report_gpt2_xl PROPERTIES TIMEOUT 120 LABELS "e2e;plan"
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    PASS_REGULAR_EXPRESSION "sharding: hybrid_shard_zero2 - 2 shard groups of 8 ranks.*recommendation: parallel.strategy = ")
  # The 70B LoRA deck planned for 8 GPUs of 80 GiB (fused attention): full_shard with
  # recomputation fits; the same shape's full fine-tune fits nothing, and the recommendation names
  # cpu_offload with its host memory and LoRA with its rank, each planned.
  add_test(NAME e2e_plan_report_llama_70b_lora
    COMMAND $<TARGET_FILE:shardtrain> plan ${PROJECT_SOURCE_DIR}/inputs/llama-70b-lora.toml --ranks 8
            --device-memory 80GiB --target cuda --compute-tflops 150 --cores-per-host 64)
  add_test(NAME e2e_plan_report_llama_70b_full
    COMMAND $<TARGET_FILE:shardtrain> plan ${PROJECT_SOURCE_DIR}/inputs/llama-70b-lora.toml --ranks 8
            --device-memory 80GiB --target cuda --compute-tflops 150 --cores-per-host 64 --set lora.rank=0)
  set_tests_properties(e2e_plan_report_llama_70b_lora e2e_plan_report_llama_70b_full PROPERTIES TIMEOUT 120
    LABELS "e2e;plan" ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  set_tests_properties(e2e_plan_report_llama_70b_lora PROPERTIES PASS_REGULAR_EXPRESSION
    "frozen shards \\(bf16\\).*recommendation: parallel.strategy = \"full_shard\" with fsdp.activation_checkpointing = true")
  set_tests_properties(e2e_plan_report_llama_70b_full PROPERTIES PASS_REGULAR_EXPRESSION
    "nothing fits.*fsdp.cpu_offload = true: full_shard[^\n]*host memory [0-9.]+ GiB per rank, [0-9.]+ TiB per host of 8 ranks.*lora.rank = 16 on lora.targets = \\[\"all-linear\"\\]: full_shard")
  # QLoRA (inputs/llama-70b-qlora.toml: LoRA r 64, the base's linear weights in NF4 with double
  # quantization, micro-batch 1 x 2048, recomputation) on GPUs without 80 GB: 8 x 24 GiB with at
  # least 25% headroom (peak <= 18 GiB), 4 x 48 GiB, and 2 x 24 GiB with cpu_offload at most
  # 19.6 GiB per card with its host memory stated. The same LoRA with its base in bf16 fits
  # nothing on 8 x 24 GiB, and the recommendation names QLoRA with its --set keys.
  set(qlora_flags --target cuda --compute-tflops 150 --cores-per-host 64)
  add_test(NAME e2e_plan_report_llama_70b_qlora_8x24
    COMMAND $<TARGET_FILE:shardtrain> plan ${PROJECT_SOURCE_DIR}/inputs/llama-70b-qlora.toml --ranks 8
            --device-memory 24GiB ${qlora_flags})
  add_test(NAME e2e_plan_report_llama_70b_qlora_4x48
    COMMAND $<TARGET_FILE:shardtrain> plan ${PROJECT_SOURCE_DIR}/inputs/llama-70b-qlora.toml --ranks 4
            --device-memory 48GiB ${qlora_flags})
  add_test(NAME e2e_plan_report_llama_70b_qlora_2x24_offload
    COMMAND $<TARGET_FILE:shardtrain> plan ${PROJECT_SOURCE_DIR}/inputs/llama-70b-qlora.toml --ranks 2
            --device-memory 24GiB ${qlora_flags} --set fsdp.cpu_offload=true)
  add_test(NAME e2e_plan_report_llama_70b_lora_names_qlora
    COMMAND $<TARGET_FILE:shardtrain> plan ${PROJECT_SOURCE_DIR}/inputs/llama-70b-lora.toml --ranks 8
            --device-memory 24GiB ${qlora_flags} --set lora.rank=64 --set train.micro_batch=1)
  set_tests_properties(e2e_plan_report_llama_70b_qlora_8x24 e2e_plan_report_llama_70b_qlora_4x48
    e2e_plan_report_llama_70b_qlora_2x24_offload e2e_plan_report_llama_70b_lora_names_qlora PROPERTIES TIMEOUT 180
    LABELS "e2e;plan" ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  set_tests_properties(e2e_plan_report_llama_70b_qlora_8x24 PROPERTIES PASS_REGULAR_EXPRESSION
    "frozen shards \\(NF4\\).*NF4 gathers in flight.*recommendation: parallel.strategy = \"full_shard\" with fsdp.activation_checkpointing = true \\(peak (1[0-7]|[0-9])\\.[0-9]+ GiB of 24.00 GiB")
  set_tests_properties(e2e_plan_report_llama_70b_qlora_4x48 PROPERTIES PASS_REGULAR_EXPRESSION
    "frozen shards \\(NF4\\).*recommendation: parallel.strategy = \"full_shard\" with fsdp.activation_checkpointing = true \\(peak [0-9.]+ GiB of 48.00 GiB")
  set_tests_properties(e2e_plan_report_llama_70b_qlora_2x24_offload PROPERTIES PASS_REGULAR_EXPRESSION
    "host memory / rank[^\n]*GiB.*host memory / host.*recommendation: parallel.strategy = \"full_shard\" with fsdp.activation_checkpointing = true \\(peak (1[0-8]\\.[0-9]+|19\\.[0-5][0-9]*|[0-9]\\.[0-9]+) GiB of 24.00 GiB")
  set_tests_properties(e2e_plan_report_llama_70b_lora_names_qlora PROPERTIES PASS_REGULAR_EXPRESSION
    "nothing fits 24.00 GiB.*recommendation: QLoRA, the only change planned above that fits 8 ranks[^\n]*: --set lora.base_dtype=nf4 --set lora.nf4_double_quant=true --set parallel.strategy=full_shard")
  # A bad size is a user error (exit 2).
  add_test(NAME e2e_plan_bad_device_memory
    COMMAND $<TARGET_FILE:shardtrain> plan ${CMAKE_CURRENT_LIST_DIR}/plan/gpt2-fp32.toml --device-memory 12parsecs)
  set_tests_properties(e2e_plan_bad_device_memory PROPERTIES TIMEOUT 60 LABELS "e2e;plan" WILL_FAIL TRUE
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  # maxbatch at 2 ranks under a 40 MiB per-rank limit: full_shard with the default search
  # (start at the planner's answer, bracket it with real steps), no_shard by doubling from 1
  # then bisection. Each prints its table row. (That the answers are exact is what the
  # plan --measure tests check; here the search must complete and report a micro-batch.)
  add_test(NAME e2e_maxbatch_planned_full_shard
    COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 2 $<TARGET_FILE:shardtrain> maxbatch
            ${CMAKE_CURRENT_LIST_DIR}/plan/gpt2-fp32.toml --strategy full_shard --memory-limit 40MiB --max 64 --steps 1)
  add_test(NAME e2e_maxbatch_doubling_no_shard
    COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 2 $<TARGET_FILE:shardtrain> maxbatch
            ${CMAKE_CURRENT_LIST_DIR}/plan/gpt2-fp32.toml --strategy no_shard --memory-limit 40MiB --max 64 --steps 1
            --search doubling)
  set_tests_properties(e2e_maxbatch_planned_full_shard e2e_maxbatch_doubling_no_shard PROPERTIES PROCESSORS 2
    TIMEOUT 180 LABELS "e2e;mpi;plan" ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  set_tests_properties(e2e_maxbatch_planned_full_shard PROPERTIES
    PASS_REGULAR_EXPRESSION "\\| full_shard \\| 2 \\| gpt2 4x128, 0.9 M params \\| [1-9][0-9]* \\|.*MAXBATCH strategy=full_shard ranks=2 vary=micro_batch max=[1-9][0-9]* planned=[1-9]")
  set_tests_properties(e2e_maxbatch_doubling_no_shard PROPERTIES
    PASS_REGULAR_EXPRESSION "probe no_shard +micro-batch +8:.*\\| no_shard \\| 2 \\| gpt2 4x128, 0.9 M params \\| [1-9][0-9]* \\|")
endif()
# --inter-host-weight takes W or W,W2,...; anything else is a user error (exit 2) naming the item.
if(TARGET shardtrain)
  add_test(NAME e2e_plan_bad_inter_host_weight
    COMMAND $<TARGET_FILE:shardtrain> plan ${CMAKE_CURRENT_LIST_DIR}/plan/gpt2-fp32.toml --ranks 4 --ranks-per-host 2
            --inter-host-weight 8,fast)
  set_tests_properties(e2e_plan_bad_inter_host_weight PROPERTIES TIMEOUT 60 LABELS "e2e;plan"
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    PASS_REGULAR_EXPRESSION "--inter-host-weight '8,fast'.*not 'fast'")
endif()
