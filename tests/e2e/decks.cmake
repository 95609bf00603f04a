# `shardtrain deck check` on every shipped deck in inputs/: each must be valid (exit code 0;
# no PASS_REGULAR_EXPRESSION, which would make ctest ignore the exit code). Checking reads no
# data, so no dataset has to be prepared. Run without mpirun: a singleton MPI process (a few
# seconds each, up to ~10 s on a loaded 2-core VM).
if(TARGET shardtrain)
  file(GLOB shipped_decks CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/inputs/*.toml)
  list(SORT shipped_decks)
  foreach(deck_file IN LISTS shipped_decks)
    get_filename_component(stem ${deck_file} NAME_WE)
    string(MAKE_C_IDENTIFIER "${stem}" stem_id)
    add_test(NAME e2e_inputs_deck_check_${stem_id} COMMAND shardtrain deck check ${deck_file}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    # An isolated singleton (no orted): the start-up as a plain singleton is what the
    # e2e_deck_check_* tests exercise.
    set_tests_properties(e2e_inputs_deck_check_${stem_id} PROPERTIES TIMEOUT 120 LABELS "e2e;deck;inputs"
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_ess_singleton_isolated=1")
  endforeach()
endif()
