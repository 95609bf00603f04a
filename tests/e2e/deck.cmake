# `shardtrain deck check` on every malformed deck: exit code 2 and one error line naming the file.
# Run without mpirun: a singleton MPI process, so that mpirun's own abort banner is not on stderr.
if(TARGET shardtrain)
  set(deck_bad_dir ${PROJECT_SOURCE_DIR}/tests/decks/bad)
  set(deck_user_error ${CMAKE_CURRENT_LIST_DIR}/scripts/expect_user_error.cmake)
  file(GLOB deck_bad_files CONFIGURE_DEPENDS ${deck_bad_dir}/*.toml)
  function(add_deck_user_error_test name expect)
    string(REPLACE ";" "|" command "$<TARGET_FILE:shardtrain>;${ARGN}")
    add_test(NAME ${name}
      COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${command}" "-DEXPECT=${expect}" -P ${deck_user_error})
    set_tests_properties(${name} PROPERTIES TIMEOUT 60 LABELS "e2e;deck"
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  endfunction()
  foreach(deck_file IN LISTS deck_bad_files)
    get_filename_component(stem ${deck_file} NAME_WE)
    add_deck_user_error_test(e2e_deck_check_bad_${stem} "${stem}.toml:" deck check ${deck_file})
  endforeach()
  add_deck_user_error_test(e2e_deck_check_missing_file "no_such_deck.toml" deck check ${deck_bad_dir}/no_such_deck.toml)
  add_deck_user_error_test(e2e_deck_check_directory "is a directory" deck check ${deck_bad_dir})
  set(deck_good ${PROJECT_SOURCE_DIR}/tests/decks/good/minimal.toml)
  add_deck_user_error_test(e2e_deck_check_bad_override "--set optimizer.lr=abc: expected a float"
    deck check ${deck_good} --set optimizer.lr=abc)

  add_test(NAME e2e_deck_check_good COMMAND shardtrain deck check ${deck_good} --set train.max_steps=7)
  set_tests_properties(e2e_deck_check_good PROPERTIES TIMEOUT 60 LABELS "e2e;deck"
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    PASS_REGULAR_EXPRESSION "max_steps = 7 .*# valid deck: 9 of [0-9]+ keys set")
endif()
