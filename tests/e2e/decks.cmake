# `shardtrain deck check` on every shipped deck in inputs/: each must be valid (exit code 0,
# output ending in "# valid deck"). Checking reads no data, so no dataset has to be prepared.
# Run without mpirun: a singleton MPI process.
if(TARGET shardtrain)
  file(GLOB shipped_decks CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/inputs/*.toml)
  list(SORT shipped_decks)
  foreach(deck_file IN LISTS shipped_decks)
    get_filename_component(stem ${deck_file} NAME_WE)
    string(MAKE_C_IDENTIFIER "${stem}" stem_id)
    add_test(NAME e2e_inputs_deck_check_${stem_id} COMMAND shardtrain deck check ${deck_file}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e_inputs_deck_check_${stem_id} PROPERTIES TIMEOUT 60 LABELS "e2e;deck;inputs"
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
      PASS_REGULAR_EXPRESSION "# valid deck: [0-9]+ of [0-9]+ keys set")
  endforeach()
endif()
