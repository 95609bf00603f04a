# The docs run as written (issue 29): every command block of README.md and docs/*.md is ```bash
# and either runs after `scripts/quickstart` or says what it needs (`# needs: ...`); no bare
# `shardtrain`; every inputs/, jobscripts/, scripts/ path they name exists (docs_blocks_check,
# no binary needed). e2e_docs_run runs the runnable blocks in workspaces that hold a real
# quickstart run, train.max_steps capped at 20 (tests/docs/doc_blocks.py says how).
find_program(SHARDTRAIN_DOCS_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SHARDTRAIN_DOCS_PYTHON)
  add_test(NAME docs_blocks_check
    COMMAND ${SHARDTRAIN_DOCS_PYTHON} ${PROJECT_SOURCE_DIR}/tests/docs/doc_blocks.py check ${PROJECT_SOURCE_DIR})
  set_tests_properties(docs_blocks_check PROPERTIES LABELS "docs;unit" TIMEOUT 30)
  if(TARGET shardtrain)
    add_test(NAME e2e_docs_run
      COMMAND ${SHARDTRAIN_DOCS_PYTHON} ${PROJECT_SOURCE_DIR}/tests/docs/doc_blocks.py run ${PROJECT_SOURCE_DIR}
              $<TARGET_FILE:shardtrain>)
    # Whole documents' commands (4-rank jobs among them): alone on the machine, ~15 min on 2 cores.
    set_tests_properties(e2e_docs_run PROPERTIES LABELS "e2e;docs" TIMEOUT 3600 RUN_SERIAL TRUE
      ENVIRONMENT "OMP_NUM_THREADS=1")
  endif()
endif()
