# cmake -DSOURCE_DIR=... -DVERSION=... -DIN=version.cpp.in -DOUT=version.cpp -P GitRevision.cmake
# Writes OUT with the version and `git describe --always --dirty` of SOURCE_DIR ("unknown" outside
# a git checkout or without git). configure_file leaves OUT untouched when its text is unchanged,
# so a build after a commit recompiles this one file, and a build with no change recompiles none.
set(SHARDTRAIN_GIT_REVISION unknown)
find_program(GIT_EXECUTABLE git)
if(GIT_EXECUTABLE)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} describe --always --dirty
                  RESULT_VARIABLE rc OUTPUT_VARIABLE rev ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0 AND rev)
    set(SHARDTRAIN_GIT_REVISION ${rev})
  endif()
endif()
set(SHARDTRAIN_VERSION_STRING ${VERSION})
configure_file(${IN} ${OUT} @ONLY)
