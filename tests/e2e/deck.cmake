# `shardtrain deck check` on malformed decks: exit code 2 and one error line naming the file.
# Run without mpirun: a singleton MPI process, so that mpirun's own abort banner is not on stderr.
# One bad deck per place in the deck reader that raises the error: the CLI turns every deck
# UserError into exit 2 and one "error:" line the same way, so the other files would run the same
# path again (a second or more each). Every file in tests/decks/bad is checked in-process by
# test_deck (DeckBad.EachFailsWithFileLineAndCulprit: file:line, culprit, a one-line message).
if(TARGET shardtrain)
  set(deck_bad_dir ${PROJECT_SOURCE_DIR}/tests/decks/bad)
  set(deck_user_error ${CMAKE_CURRENT_LIST_DIR}/scripts/expect_user_error.cmake)
  set(deck_bad_files)
  foreach(stem
      syntax_unclosed_string   # toml++ syntax error, re-raised with file:line
      binary_garbage           # not UTF-8 text: toml++'s error plus the hint
      unknown_section          # top-level structure (with a suggestion)
      unknown_key_typo         # a key inside a section (with a suggestion)
      string_for_int           # a value of the wrong type
      zero_timeout             # a value out of range
      heads_do_not_divide)     # a relation between keys
    if(NOT EXISTS ${deck_bad_dir}/${stem}.toml)
      message(FATAL_ERROR "tests/e2e/deck.cmake: no bad deck ${deck_bad_dir}/${stem}.toml")
    endif()
    list(APPEND deck_bad_files ${deck_bad_dir}/${stem}.toml)
  endforeach()
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
  # An architecture's own shape rule comes from the model layer (model::resolve_spec).
  add_deck_user_error_test(e2e_deck_check_bad_vit_patch "vit: patch_size 5 does not tile image_size 28"
    deck check ${deck_good} --set model.arch=vit --set model.image_size=28 --set model.patch_size=5)

  # docs/deck-reference.md is exactly what the program renders from the schema (the model
  # layer's architectures and presets included). Regenerate with
  # `<build>/bin/shardtrain deck reference -o docs/deck-reference.md`.
  add_test(NAME e2e_deck_reference
    COMMAND sh -c "\"$1\" deck reference -o \"$2\" && cmp \"$2\" \"$3\" || { echo \"FAIL: $3 is out of date: regenerate it with: shardtrain deck reference -o docs/deck-reference.md\"; exit 1; }"
            sh $<TARGET_FILE:shardtrain> ${CMAKE_CURRENT_BINARY_DIR}/deck-reference.md ${PROJECT_SOURCE_DIR}/docs/deck-reference.md)
  set_tests_properties(e2e_deck_reference PROPERTIES TIMEOUT 60 LABELS "e2e;deck"
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  add_test(NAME e2e_deck_check_good COMMAND shardtrain deck check ${deck_good} --set train.max_steps=7)
  set_tests_properties(e2e_deck_check_good PROPERTIES TIMEOUT 60 LABELS "e2e;deck"
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    PASS_REGULAR_EXPRESSION "max_steps = 7 .*# valid deck: 9 of [0-9]+ keys set")
endif()
