// Compiles the precompiled torch header (cmake/torch_pch.h) once for the targets that reuse it
// (shardtrain_torch_pch in cmake/AddMpiTest.cmake); nothing of its own.
