# Model tokenizers (issue #26): tokenizer.json files against reference implementations, a
# tokenizer.model through SentencePiece against spm_encode, and bad tokenizer files. The
# reference tests skip (exit 77) without node, the npm packages or the SentencePiece tools.
if(TARGET shardtrain)
  set(tok_dir ${PROJECT_SOURCE_DIR}/tests/tokenizers)
  set(tok_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_ess_singleton_isolated=1;OMP_NUM_THREADS=1")
  add_test(NAME e2e_tokenizer_references
    COMMAND bash ${tok_dir}/test_references.sh $<TARGET_FILE:shardtrain> ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_references)
  set_tests_properties(e2e_tokenizer_references PROPERTIES TIMEOUT 900 PROCESSORS 2 LABELS "e2e;data;tokenizer"
    SKIP_RETURN_CODE 77 ENVIRONMENT "${tok_env}")
  add_test(NAME e2e_tokenizer_sentencepiece
    COMMAND bash ${tok_dir}/test_sentencepiece.sh $<TARGET_FILE:shardtrain> ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_spm)
  set_tests_properties(e2e_tokenizer_sentencepiece PROPERTIES TIMEOUT 300 LABELS "e2e;data;tokenizer"
    SKIP_RETURN_CODE 77 ENVIRONMENT "${tok_env}")

  # Bad tokenizer files: exit 2 with one line naming the file and the key.
  function(add_tokenizer_user_error_test name expect tokenizer)
    string(REPLACE ";" "|" command
      "$<TARGET_FILE:shardtrain>;data;encode;--tokenizer;${tokenizer};${tok_dir}/edge_cases.txt;${CMAKE_CURRENT_BINARY_DIR}/${name}.ids")
    add_test(NAME ${name}
      COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${command}" "-DEXPECT=${expect}" -P ${CMAKE_CURRENT_LIST_DIR}/scripts/expect_user_error.cmake)
    set_tests_properties(${name} PROPERTIES TIMEOUT 60 LABELS "e2e;data;tokenizer" ENVIRONMENT "${tok_env}")
  endfunction()
  set(bad ${tok_dir}/bad)
  add_tokenizer_user_error_test(e2e_tokenizer_bad_wordpiece "wordpiece.json': model.type: 'WordPiece' is not supported" ${bad}/wordpiece.json)
  add_tokenizer_user_error_test(e2e_tokenizer_bad_unigram "unigram.json': model.type: 'Unigram' is not supported" ${bad}/unigram.json)
  add_tokenizer_user_error_test(e2e_tokenizer_bad_pre_tokenizer
    "whitespace_pre_tokenizer.json': pre_tokenizer.pretokenizers[0].type: 'Whitespace' is not supported" ${bad}/whitespace_pre_tokenizer.json)
  add_tokenizer_user_error_test(e2e_tokenizer_bad_normalizer
    "lowercase_normalizer.json': normalizer.type: 'Lowercase' is not supported" ${bad}/lowercase_normalizer.json)
  add_tokenizer_user_error_test(e2e_tokenizer_bad_merge "bad_merge.json': model.merges[1]: merge 'ab c'" ${bad}/bad_merge.json)
  add_tokenizer_user_error_test(e2e_tokenizer_truncated_json "truncated.json' is not valid JSON" ${bad}/truncated.json)
  add_tokenizer_user_error_test(e2e_tokenizer_garbage_json "garbage.json' is not valid JSON" ${bad}/garbage.json)
  add_tokenizer_user_error_test(e2e_tokenizer_garbage_model "garbage.model' is not a SentencePiece model" ${bad}/garbage.model)
  add_tokenizer_user_error_test(e2e_tokenizer_missing_file "unknown tokenizer '${bad}/no_such/tokenizer.json'"
    ${bad}/no_such/tokenizer.json)
  add_tokenizer_user_error_test(e2e_tokenizer_empty_directory "tokenizer directory '${bad}' has neither tokenizer.json nor tokenizer.model" ${bad})
endif()
