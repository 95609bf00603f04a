# `cmake --install build --prefix P`: what an installed shardtrain is (docs/getting-started.md,
# "Installing on a cluster"):
#   P/bin/shardtrain                         the binary
#   P/lib/shardtrain/shardtrain_spm_shim.so  the SentencePiece module it opens (src/data)
#   P/share/shardtrain/{jobscripts,inputs}   the jobscripts and the example decks
#   P/share/shardtrain/data                  gpt2/ and janeaustenr/ from .data, when fetched
#   P/share/doc/shardtrain                   README.md and docs/
#   P/share/modulefiles/shardtrain/<version>.lua  an Lmod module
#   P/include/shardtrain, P/lib/libshardtrain_*.a, P/lib/cmake/shardtrain  the CMake package:
#     find_package(shardtrain) gives shardtrain::<layer> (util, deck, runtime, comm, optim, model,
#     data_core, data, infer, report, fsdp_hook, fsdp, ckpt, plan, train, model_io, probe).
# The binary finds the shim and the data relative to itself (src/data/paths.cpp), so the prefix
# may be moved; so does the module (it derives the prefix from its own path).
include(CMakePackageConfigHelpers)
set(SHARDTRAIN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/shardtrain)
set(SHARDTRAIN_INSTALL_SHARE ${CMAKE_INSTALL_DATADIR}/shardtrain)

install(TARGETS shardtrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS shardtrain_spm_shim LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/shardtrain)

# The layers, as the static libraries the binary is linked from, with every header of include/.
get_property(_st_layers GLOBAL PROPERTY SHARDTRAIN_LAYER_TARGETS)
set_target_properties(shardtrain_fsdp_hook PROPERTIES EXPORT_NAME fsdp_hook)
install(TARGETS ${_st_layers} shardtrain_fsdp_hook EXPORT shardtrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/shardtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT shardtrainTargets NAMESPACE shardtrain:: DESTINATION ${SHARDTRAIN_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/shardtrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/shardtrainConfig.cmake INSTALL_DESTINATION ${SHARDTRAIN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardtrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardtrainConfig.cmake ${PROJECT_BINARY_DIR}/shardtrainConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/shardtrainFindDependencies.cmake ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake
        DESTINATION ${SHARDTRAIN_INSTALL_CMAKEDIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/jobscripts/ DESTINATION ${SHARDTRAIN_INSTALL_SHARE}/jobscripts
        USE_SOURCE_PERMISSIONS)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/inputs/ DESTINATION ${SHARDTRAIN_INSTALL_SHARE}/inputs)
# The tokenizer files and the Austen sources scripts/fetch-data put in .data (not the prepared
# data sets: those belong to a user's own directory).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/.data/gpt2 ${PROJECT_SOURCE_DIR}/.data/janeaustenr
        DESTINATION ${SHARDTRAIN_INSTALL_SHARE}/data OPTIONAL)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The Lmod module: <prefix>/share/modulefiles/shardtrain/<version>.lua.
configure_file(${PROJECT_SOURCE_DIR}/cmake/shardtrain-module.lua.in ${PROJECT_BINARY_DIR}/shardtrain-module.lua @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/shardtrain-module.lua DESTINATION ${CMAKE_INSTALL_DATADIR}/modulefiles/shardtrain
        RENAME ${PROJECT_VERSION}.lua)
