add_unit_test(NAME test_deck
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_deck_good.cpp ${CMAKE_CURRENT_LIST_DIR}/test_deck_bad.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_deck_reference.cpp
  LIBS shardtrain::deck)
# The bad decks and the committed reference live in the source tree.
target_compile_definitions(test_deck PRIVATE SHARDTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
